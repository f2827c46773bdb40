"""``poplin``: matrix multiplications and convolutions with a planner (PopLibs ``include/poplin``).

- :mod:`.params`: ``ConvParams`` with its input / kernel / output transforms, ``getGradientParams``;
- :mod:`.plan`: the planner (splits over tiles, vertex estimates, memory budget, ``PlanningCache``);
- :mod:`.matmul`: ``matMul``, ``matMulGrouped``, ``matMulAcc``, ``createMatMulInputLHS/RHS`` ...;
- :mod:`.convolution`: ``convolution``, ``createInput``, ``createWeights``, ``createBiases``,
  ``addBias``, ``calculateWeightDeltas``, ``convolutionWeightUpdate``;
- :mod:`.layout`: a plan's tile layout and the creators of tensors laid out for it;
- :mod:`.kernels`: the host kernels of the partial-sum and reduce vertices;
- :mod:`.core`: building a plan into vertex groups and serial loops (not PopLibs API).
"""

from openipu.poplibs.poplin.convolution import *  # noqa: F401,F403
from openipu.poplibs.poplin.convolution import __all__ as _conv_all
from openipu.poplibs.poplin.matmul import *  # noqa: F401,F403
from openipu.poplibs.poplin.matmul import __all__ as _mm_all
from openipu.poplibs.poplin.params import ConvParams, InputTransform, OutputTransform, poplibs_error
from openipu.poplibs.poplin.plan import ConvPlan, PlanningCache, plan_convolution, plan_matmul


def addCodelets(graph) -> None:  # noqa: N802
    """Register poplin's codelets (built in; kept for API compatibility)."""


__all__ = ["addCodelets", "ConvParams", "InputTransform", "OutputTransform", "poplibs_error", "ConvPlan",
           "PlanningCache", "plan_convolution", "plan_matmul", *_conv_all, *_mm_all]
