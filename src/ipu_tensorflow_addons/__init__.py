"""Drop-in ``ipu_tensorflow_addons`` (Graphcore's IPU TensorFlow add-ons, SDK 2.5+):
``ipu_tensorflow_addons.keras.layers`` are :mod:`openipu.tensorflow.keras.layers`. Needs the
``tensorflow`` extra; importing it imports ``tensorflow.python.ipu``."""

from . import keras  # noqa: F401
