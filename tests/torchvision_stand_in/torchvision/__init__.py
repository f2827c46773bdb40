"""A stand-in for torchvision, for running Graphcore's PopTorch programs unmodified where the real
wheels do not load (the CUDA builds need libtorch_cuda) and no dataset can be downloaded
(``test_popdist.py``, ``examples/poptorch/run_graphcore_program.py``). Not torchvision's code.

- ``datasets.CIFAR10``: synthetic 32x32x3 uint8 images, 10 classes (32 training / 16 test).
- ``datasets.MNIST`` / ``FashionMNIST``: scikit-learn's 8x8 digits upsampled to a 20x20 digit in
  a 4-pixel border (MNIST's 28x28 layout), uint8, as PIL images when Pillow is installed (else
  2-D uint8 arrays); the first ``TVSTUB_N`` training / ``TVSTUB_NTEST`` test images (default
  256 / 128) of a fixed stratified 80/20 split (1,437 / 360 digits; more repeat them in order).
- ``models``: the ResNet-18 and MobileNetV2 architectures (random weights; ``pretrained`` /
  ``weights`` ignored).
- ``transforms``: ``Compose``, ``ToTensor``, ``Normalize``, ``Resize``, ``Lambda``,
  ``ConvertImageDtype``, ``ToPILImage``, ``Grayscale``, ``InterpolationMode``.
"""
from . import datasets, models, transforms  # noqa: F401

__version__ = "0.0+openipu-stand-in"
