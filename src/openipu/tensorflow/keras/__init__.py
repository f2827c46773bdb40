"""``ipu.keras`` (SDK 2.2-3.0: ``tensorflow.python.ipu.keras``): the IPU Keras layers
(:mod:`.layers`) and ``PipelineStage``. SDK 2.6+ spells the layers
``ipu_tensorflow_addons.keras.layers`` (the same classes)."""

from ..keras_ipu import PipelineStage  # noqa: F401
from . import layers  # noqa: F401
