"""``popops``: PopLibs' general operations (``include/popops/*.hpp``), one op family per module.

- ``elementwise``: binary and unary elementwise ops (``ElementWise.hpp``).
- ``expr``: the expression API of ``map`` (``Expr.hpp``); ``cast``: cast, fill, zero, iota, pad, encodeOneHot.
- ``reduce``: reductions (``Reduce.hpp``).
- ``dynamic_slice``: slicing at run-time offsets (``DynamicSlice.hpp``): ``dynamicSlice`` /
  ``dynamicUpdate``; ``multi_slice``: ``multiSlice`` / ``multiUpdate*``; ``slice_plan``: slice plans
  and sliceable layouts (``embedding::plan``, ``createSliceableTensor``).
- ``gather``: XLA gather and scatter (``Gather.hpp``, ``Scatter.hpp``).
- ``sort``: sort and top-k (``Sort.hpp``, ``TopK.hpp``).
- ``loop``: counted loops (``Loop.hpp``).
"""

from openipu.poplibs.popops.elementwise import *  # noqa: F401,F403
from openipu.poplibs.popops.elementwise import __all__ as _ew_all
from openipu.poplibs.popops.reduce import *  # noqa: F401,F403,E402
from openipu.poplibs.popops.dynamic_slice import *  # noqa: F401,F403,E402
from openipu.poplibs.popops.gather import *  # noqa: F401,F403,E402
from openipu.poplibs.popops.sort import *  # noqa: F401,F403,E402
from openipu.poplibs.popops.loop import *  # noqa: F401,F403,E402
from openipu.poplibs.popops import expr  # noqa: F401,E402
from openipu.poplibs.popops.cast import *  # noqa: F401,F403,E402
from openipu.poplibs.popops.scaled_add import ScaledAddSpecialisation, scaledAddTo, scaledSubtractFrom  # noqa: F401


def addCodelets(graph) -> None:  # noqa: N802
    """Register popops' codelets (library vertices are built in; kept for API compatibility)."""


__all__ = ["addCodelets", *_ew_all]
