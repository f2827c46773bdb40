"""A stand-in for torchvision, for running Graphcore's PopDist PopTorch example in
``test_popdist.py`` where the real wheels do not load (the CUDA builds need libtorch_cuda) and
CIFAR-10 cannot be downloaded: ``models.resnet18`` (the ResNet-18 architecture: 7x7 stem, max
pool, 4 stages of 2 basic blocks, global average pool, 1000-way linear), ``datasets.CIFAR10``
(32 training / 16 test synthetic 32x32x3 uint8 images, 10 classes; no download) and
``transforms`` (``ToTensor``, ``Normalize``, ``Compose``). Not torchvision's code."""
from . import datasets, models, transforms  # noqa: F401
