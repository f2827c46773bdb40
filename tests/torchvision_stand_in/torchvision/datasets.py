import numpy as np
import torch


class CIFAR10(torch.utils.data.Dataset):
    """Synthetic CIFAR-10 shaped data (32x32x3 uint8, 10 classes), no download."""

    def __init__(self, root, train=True, download=False, transform=None):
        n = 32 if train else 16
        rng = np.random.default_rng(0 if train else 1)
        self.data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        self.targets = rng.integers(0, 10, n).tolist()
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x = self.data[i]
        return (self.transform(x) if self.transform else x), self.targets[i]


def _digits(train):
    """(images uint8 [N, 28, 28], labels int64 [N]) from scikit-learn's digits."""
    import os

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    xtr, xte, ytr, yte = train_test_split(d.images.astype(np.float32) / 16.0, d.target.astype(np.int64),
                                          test_size=0.2, random_state=0, stratify=d.target)
    x, y = (xtr, ytr) if train else (xte, yte)
    n = int(os.environ.get("TVSTUB_N" if train else "TVSTUB_NTEST", "256" if train else "128"))
    if n > len(y):      # more than scikit-learn's digits: the digits again, in order
        reps = -(-n // len(y))
        x, y = np.concatenate([x] * reps), np.concatenate([y] * reps)
    x, y = x[:n], y[:n]
    img = torch.nn.functional.interpolate(torch.from_numpy(x)[:, None], size=(20, 20), mode="bilinear",
                                          align_corners=False).clamp_(0, 1)
    img = torch.nn.functional.pad(img, (4, 4, 4, 4))
    return (img[:, 0] * 255).round().to(torch.uint8), torch.from_numpy(y)


class MNIST(torch.utils.data.Dataset):
    """MNIST-shaped digits (see the package docstring); ``root`` / ``download`` ignored."""
    classes = [str(i) for i in range(10)]

    def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False):
        self.data, self.targets = _digits(train)
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        img = self.data[i].numpy()
        try:
            from PIL import Image
            img = Image.fromarray(img, mode="L")
        except ImportError:
            pass
        t = int(self.targets[i])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            t = self.target_transform(t)
        return img, t


class FashionMNIST(MNIST):
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot"]
