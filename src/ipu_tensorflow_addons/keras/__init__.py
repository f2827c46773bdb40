"""``ipu_tensorflow_addons.keras``: the IPU Keras layers (:mod:`.layers`)."""

import sys as _sys

from tensorflow.python.ipu.keras import layers  # noqa: F401

_sys.modules[__name__ + ".layers"] = layers
