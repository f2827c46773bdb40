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
