"""``popnn``: PopLibs' neural-network operations (``include/popnn/*.hpp``), one op family per module.

- ``non_linearity``: ``NonLinearityType``, ``nonLinearity``, ``nonLinearityInPlace``,
  ``nonLinearityInputGradient``, softmax variants, ``logSoftmax`` (``NonLinearity.hpp``,
  ``LogSoftmax.hpp``).
- ``loss``: ``LossType``, ``calcLoss``, ``calcAccuracy``, ``argMax``, ``argMin``, ``maxAndArgMax``,
  ``minAndArgMin``, ``topK`` (``Loss.hpp``).
- ``pooling``: ``popnn.pooling.PoolParams``, ``pool``, ``poolInputGradient`` (``Pooling.hpp``).
- ``norms``: ``popnn.bn``, ``popnn.gn``, ``popnn.ln``, ``popnn.in_`` (``popnn::in``; ``in`` is a
  Python keyword, ``getattr(popnn, "in")`` also works) (``BatchNorm.hpp``, ``GroupNorm.hpp``,
  ``LayerNorm.hpp``, ``InstanceNorm.hpp``).

Errors that PopLibs raises as ``poputil::poplibs_error`` are :class:`poplibs_error` (a
``poplar.poplar_error``).
"""

from openipu.poplibs.popnn._common import poplibs_error
from openipu.poplibs.popnn.non_linearity import *  # noqa: F401,F403
from openipu.poplibs.popnn.non_linearity import __all__ as _nl_all
from openipu.poplibs.popnn.loss import *  # noqa: F401,F403
from openipu.poplibs.popnn.loss import __all__ as _loss_all
from openipu.poplibs.popnn.norms import bn, gn, in_, ln  # noqa: F401
from openipu.poplibs.popnn import pooling  # noqa: F401,E402
from openipu.poplibs.popnn import gru, lstm  # noqa: F401,E402


def addCodelets(graph) -> None:  # noqa: N802
    """Register popnn's codelets (library vertices are built in; kept for API compatibility)."""


__all__ = ["addCodelets", "poplibs_error", *_nl_all, *_loss_all, "bn", "gn", "ln", "in_", "pooling"]
globals()["in"] = in_   # popnn::in (a Python keyword): getattr(popnn, "in")
