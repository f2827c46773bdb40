"""The data of the PopTorch tutorial ports: scikit-learn's digits in place of MNIST / FashionMNIST.

Nothing can be downloaded here and torchvision is not a dependency, so the ports of Graphcore's
PopTorch tutorials (this folder) load :class:`Digits`: the 1,797 8x8 greyscale digits shipped
with scikit-learn, upsampled to MNIST's 1x28x28 layout. As in MNIST, the digit fills a 20x20
box centred in the 28x28 image (bilinear upsampling of the 8x8 image, 4 pixels of zero
border); pixel values are scaled to [0, 1] (what ``ToTensor`` does to MNIST's bytes), then
normalised with the ``(mean, std)`` of the tutorial's ``Normalize`` transform.

The train / test split is fixed: stratified, 20 % test (1,437 / 360 images), seed 0 (the split
of ``examples/popart/train_digits.py``).

    >>> train = Digits(train=True, normalize=(0.1307, 0.3081))
    >>> image, label = train[0]          # float32 [1, 28, 28], int
"""

from __future__ import annotations

import numpy as np
import torch

#: The normalisation constants of the tutorials' transforms.
MNIST_NORMALIZE = (0.1307, 0.3081)
FASHION_NORMALIZE = (0.5, 0.5)


def _split(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    return train_test_split(d.images.astype(np.float32) / 16.0, d.target.astype(np.int64), test_size=0.2,
                            random_state=seed, stratify=d.target)


class Digits(torch.utils.data.Dataset):
    """scikit-learn's digits as an MNIST-like ``torch`` dataset (module docstring).

    ``train``: the 1,437 training or the 360 test images. ``normalize``: ``(mean, std)`` applied
    after scaling to [0, 1] (None: no normalisation). ``size``: the side of the square image
    (28, or e.g. 128 for the mixed-precision tutorial's ``Resize(128)``); the digit covers the
    central 5/7 of it. ``dtype``: of the images (``torch.half`` for ``ConvertImageDtype``).
    Items are ``(image [1, size, size], label)`` with an ``int`` label, as torchvision's.
    """

    classes = tuple(str(i) for i in range(10))

    def __init__(self, train: bool = True, normalize=MNIST_NORMALIZE, size: int = 28, dtype=torch.float32):
        x_train, x_test, y_train, y_test = _split()
        x, y = (x_train, y_train) if train else (x_test, y_test)
        inner = round(size * 20 / 28)
        pad = (size - inner) // 2
        img = torch.nn.functional.interpolate(torch.from_numpy(x)[:, None], size=(inner, inner), mode="bilinear",
                                              align_corners=False).clamp_(0.0, 1.0)
        img = torch.nn.functional.pad(img, (pad, size - inner - pad, pad, size - inner - pad))
        if normalize is not None:
            mean, std = normalize
            img = (img - mean) / std
        self.data = img.to(dtype).contiguous()
        self.targets = torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        return self.data[i], int(self.targets[i])


def accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Percentage of ``predictions`` (scores ``[n, classes]``) whose argmax is the label; only the
    last ``n`` labels count (a training model returns the last micro-batches' outputs)."""
    ind = predictions.argmax(dim=1)
    labels = labels[-predictions.shape[0]:]
    return float((ind == labels).sum()) / labels.shape[0] * 100.0
