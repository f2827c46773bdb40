"""The IPU Keras layers (Graphcore's ``ipu_tensorflow_addons.keras.layers``; SDK 2.2-3.0
``tensorflow.python.ipu.keras.layers``) over Keras 3.

Each layer computes what Graphcore documents with TensorFlow ops, so a model using them trains
through the IPU route (tf2onnx captures the ops into the PopART program) and runs as Keras on the
host CPU outside an ``IPUStrategy``.
"""

from .core import AssumeEqualAcrossReplicas, Dropout, Embedding, RecomputationCheckpoint, SerialDense  # noqa: F401
from .normalization import (GroupNorm, GroupNormalization, InstanceNorm, InstanceNormalization,  # noqa: F401
                            LayerNorm, LayerNormalization)
from .rnn import GRU, LSTM, PopnnGRU, PopnnLSTM  # noqa: F401
