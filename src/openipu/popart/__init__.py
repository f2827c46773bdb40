"""``openipu.popart``: PopART's Python API (inference and training) on the simulated IPU.

``import popart`` (the drop-in package) re-exports everything here. Build a model with
:class:`Builder` (or load ONNX), run it with :class:`InferenceSession`::

    builder = popart.Builder()
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    b = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    o = builder.aiOnnx.add([a, b])                       # id "Add:0"
    builder.addOutputTensor(o)
    session = popart.InferenceSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
        deviceInfo=popart.DeviceManager().acquireAvailableDevice(1))
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({a: x, b: y}, anchors))

For tools such as the ``openipu run`` CLI, after ``session.prepareDevice()``:

- ``session._engine`` is the :class:`openipu.poplar.Engine` (``.memory`` the tile memory plan,
  ``.printProfileSummary()``, ``.getProfile()``);
- ``session.ops()`` lists the IR ops in execution order with ``op.op_type``, ``op.inputs``,
  ``op.outputs``, ``op.vgraph`` and ``op.lowering`` (``"precise"``: PopLibs lowering;
  ``"generic"``: the costed generic vertex group);
- ``session.getCycleCount()`` gives the predicted IPU cycles of the last ``run``;
- ``session.getSummaryReport()`` the profile summary text.

A CLI runs a file with ``InferenceSession(fnModel=path, dataFlow=DataFlow(bps, {out:
AnchorReturnType("ALL") for out in outputs}), deviceInfo=DeviceManager().acquireAvailableDevice(n),
inputShapeInfo=...)`` where symbolic input dims need an ``InputShapeInfo`` entry, then feeds
``PyStepIO`` with arrays of ``bps * replicas * nelms`` elements per input.

Training: ``TrainingSession(fnModel, dataFlow, loss, optimizer, deviceInfo, ...)`` with a loss
from ``aiGraphcore.nllloss`` / ``l1loss`` / ``identityloss`` and ``ConstSGD`` / ``SGD``
(momentum, dampening, weight decay, nesterov, velocity and loss scaling, per-weight values),
``Adam`` (Adam, AdamNoBias, AdaMax, Lamb, LambNoBias; decoupled or L2 weight decay) or
``Adaptive`` (AdaGrad, RMSProp, CenteredRMSProp, AdaDelta), non-const values changed by
``updateOptimizerFromHost``; gradient accumulation and graph replication (gradients all-reduced
with ``gcl``); call ``weightsFromHost()`` before the first ``run``. Gradients are
``Gradient___<id>`` (anchorable).

The ``aiGraphcore`` ops run in both kinds of session, with gradients where PopART has them:
losses (``identityloss``, ``nllloss``, ``l1loss``, ``ctcloss``), ``dropout`` / ``shapeddropout``
(seeded by ``session.setRandomSeed``), ``groupnormalization``, the dynamic slices, ``call`` of a
``builder.createSubgraphBuilder()`` graph (also the body of ``aiOnnx.loop`` / ``logical_if``),
``multiconv`` and the rest of PopART's opset (see :class:`AiGraphcoreOpset1`).

Recomputation: ``autoRecomputation`` (Standard, NormOnly, RecomputeAll, Pipeline) or
``builder.recomputeOutputInBackwardPass``. Pipelining (``enablePipelining`` with virtual graphs
and ``pipelineStage``) in inference and training: fill, main and flush cycles, stashed
activations, stale weights without gradient accumulation. Not supported yet: execution phases,
custom C++ ops, engine caching. The PopART rule "import popart before onnx" is not
enforced.
"""

from openipu.popart import builder, session, tensorinfo  # noqa: F401 - submodules as in PopART
from openipu.popart.builder import (AiGraphcoreOpset1, Builder, DEFAULT_AI_GRAPHCORE_OPSET as defaultAiGraphcoreOpset,
                                    DEFAULT_AI_ONNX_OPSET as defaultAiOnnxOpset)
from openipu.popart.dataflow import AnchorReturnType, AnchorReturnTypeId, DataFlow, ExchangeStrategy, TileSet
from openipu.popart.devices import (DeviceConnectionType, DeviceInfo, DeviceManager, DeviceSelectionCriterion,
                                    DeviceType)
from openipu.popart.errors import (OutOfMemoryException, RecoveryAction, _throw_application_runtime_error,
                                   _throw_popart_error, _throw_popart_internal_error, _throw_popart_runtime_error,
                                   _throw_poplar_error, _throw_poplibs_error, popart_exception,
                                   popart_internal_exception, popart_runtime_error, poplar_application_runtime_error,
                                   poplar_exception, poplar_recoverable_runtime_error, poplar_runtime_error,
                                   poplar_system_runtime_error, poplar_unknown_runtime_error,
                                   poplar_unrecoverable_runtime_error, poplibs_exception)
from openipu.popart.log import Logger, getLogger
from openipu.popart.options import *  # noqa: F401,F403 - enums and settings structs
from openipu.popart.options import InputShapeInfo, SessionOptions
from openipu.popart.patterns import Patterns
from openipu.popart.graph_transformer import GraphTransformer
from openipu.popart.debug_info import closePoplarDebugInfo, initializePoplarDebugInfo  # noqa: F401
from openipu.popart.variable_settings import CommGroup, VariableSettings
from openipu.popart.optimizer import (Adam, AdamMode, Adaptive, AdaptiveMode, ClipNormSettings, ConstSGD, Optimizer,
                                     OptimizerValue, SGD, SGDAccumulatorAndMomentum, WeightDecayMode)
from openipu.popart.session import InferenceSession, TrainingSession
from openipu.popart.stepio import PyStepIO, PyStepIOCallback, PyWeightsIO
from openipu.popart.tensorinfo import DataType, TensorInfo

defaultAiOnnxMlOpset = 1


def versionString() -> str:  # noqa: N802
    """openipu's version (it implements the PopART 3.x Python API for inference)."""
    import openipu
    return f"{openipu.__version__} (openipu; PopART 3.4 API)"


def versionNumber() -> tuple:  # noqa: N802
    return (3, 4, 0)


def packageHash() -> str:  # noqa: N802
    return "openipu"


def getSupportedOperations(includeInternal: bool = False) -> list:  # noqa: N802,N803
    """``[(domain, op_type)]`` an inference session can run: ONNX kernels plus precise lowerings."""
    from openipu.popart import graphcore_ops, lowering
    from openipu.popart.onnx_ops import supported_ops
    lowering._load()
    ops = set(supported_ops()) | set(lowering._PRECISE) | {(graphcore_ops.GRAPHCORE, n) for n in graphcore_ops._GC}
    return sorted(("ai.onnx" if d == "" else d, t) for d, t in ops)


def reservedGradientPrefix() -> str: return "Gradient___"  # noqa: E704,N802
def reservedAccumPrefix() -> str: return "Accum___"  # noqa: E704,N802
def reservedAcclPrefix() -> str: return "Accl___"  # noqa: E704,N802
def reservedAccl1Prefix() -> str: return "Accl1___"  # noqa: E704,N802
def reservedAccl2Prefix() -> str: return "Accl2___"  # noqa: E704,N802
def reservedAccl3Prefix() -> str: return "Accl3___"  # noqa: E704,N802
def reservedUpdatedVarPrefix() -> str: return "UpdatedVar___"  # noqa: E704,N802
def reservedStashedPrefix() -> str: return "Stashed___"  # noqa: E704,N802
def reservedRestoredPrefix() -> str: return "Restored___"  # noqa: E704,N802
def reservedRandomSeedPrefix() -> str: return "randomSeed___"  # noqa: E704,N802
def reservedLossScalingPrefix() -> str: return "lossScaling_"  # noqa: E704,N802
def reservedStepPrefix() -> str: return "Step___"  # noqa: E704,N802
