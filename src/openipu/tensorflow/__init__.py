"""``from tensorflow.python import ipu`` over stock TensorFlow 2 (CPU) and Keras 3 (Graphcore TF2 API).

Imported as ``tensorflow.python.ipu`` through the start-up hook :mod:`openipu_tf_hook` (installed
by ``pip install openipu[tensorflow]``). Keras models built in an ``ipu.ipu_strategy.IPUStrategy``
scope train, evaluate and predict as PopART programs on the simulated IPU
(:mod:`.keras_extensions`); ``ipu.config.IPUConfig`` / ``configure_ipu_system`` choose the IPUs.
The lower-level API (``ipu_compiler.compile``, ``loops.repeat``, the feeds, ``IPUStrategy.run``)
runs its TensorFlow functions on the host CPU for now.

``keras.ipu`` (``tensorflow.keras.ipu``) is set to :mod:`.keras_ipu` on import, as the Graphcore
Keras wheel provides it.
"""

import sys as _sys

from . import config, gradient_accumulation, ipu_compiler, ipu_infeed_queue, ipu_outfeed_queue, ipu_strategy  # noqa: F401
from . import keras_extensions as _keras_extensions
from . import keras_ipu as _keras_ipu
from . import loops, scopes, utils  # noqa: F401
from .ops import (cross_replica_ops, embedding_ops, functional_ops, math_ops, nn_ops, normalization_ops,  # noqa: F401
                  pipelining_ops, rand_ops, replication_ops)
from . import distributed, keras, ops, optimizers  # noqa: F401

_keras_extensions.install()


def _alias_keras_ipu():
    names = ("keras", "keras._tf_keras.keras", "tensorflow.keras")
    for n in names:
        mod = _sys.modules.get(n)
        if mod is not None:
            try:
                setattr(mod, "ipu", _keras_ipu)
            except Exception:       # a lazy loader that refuses attributes
                pass
    _sys.modules.setdefault("keras.ipu", _keras_ipu)
    _sys.modules.setdefault("tensorflow.keras.ipu", _keras_ipu)


import keras as _keras  # noqa: E402,F401  (keras.ipu must exist once ipu is imported)
import tensorflow.keras as _tf_keras  # noqa: E402,F401

_alias_keras_ipu()
