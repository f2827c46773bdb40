"""Host kernels for the ``ai.graphcore`` forward operators (PopART's ``AiGraphcoreOpset1``), used
when :mod:`openipu.popart.onnx_ops` has no kernel registered for them (same interface:
``fn(inputs, attrs, opset) -> outputs`` on torch tensors, attrs not defaulted). They give the
builder its shape inference (a run on zeros), constant folding, and the generic lowering; ops
with a PopLibs form also have a precise lowering (:mod:`openipu.popart.lowering.graphcore`).
Their gradients are in :mod:`openipu.popart.grads.graphcore`.

Semantics follow PopART's op definitions (``willow/include/popart/op/*.hpp``); one module per op
family (elementwise, losses, ctc, shape, sorting, scatter_gather, dynamic, normalization, conv,
rnn, random_ops, collectives, spline, packed). Importing this package registers every kernel.
"""

from openipu.popart.onnx_ops import get_kernel  # noqa: F401 - re-exported (find_kernel's first registry)
from openipu.popart.graphcore_ops._registry import DATA_TYPES, GRAPHCORE, _GC, find_kernel  # noqa: F401
from openipu.popart.graphcore_ops import (collectives, conv, ctc, dynamic, elementwise, losses,  # noqa: F401
                                          normalization, packed, random_ops, rnn, scatter_gather, shape,
                                          sorting, spline)
from openipu.popart.graphcore_ops.conv import multiconv_attrs  # noqa: F401
from openipu.popart.graphcore_ops.ctc import check_ctc_inputs, ctc_beam_search_setup  # noqa: F401
from openipu.popart.graphcore_ops.dynamic import dyn_write, sequence_rows  # noqa: F401
from openipu.popart.graphcore_ops.losses import reduce_loss  # noqa: F401
from openipu.popart.graphcore_ops.normalization import batch_norm_setup, group_norm  # noqa: F401
from openipu.popart.graphcore_ops.random_ops import seeded_keep_mask  # noqa: F401
from openipu.popart.graphcore_ops.rnn import lstm_setup  # noqa: F401
from openipu.popart.graphcore_ops.scatter_gather import grouped_gather_fn, scatter_reduce_fn, scatter_reduce_setup  # noqa: F401
from openipu.popart.graphcore_ops.shape import depth_to_space  # noqa: F401
from openipu.popart.graphcore_ops.spline import spline_basis_setup, spline_weighting_setup  # noqa: F401
