"""PopART's optimizers: ``ConstSGD``, ``SGD``, ``Adam`` and ``Adaptive`` and their hyper-parameters
(``research/popart.md`` 1.12).

A hyper-parameter is an ``OptimizerValue`` ``(value, isConst)``. A const value is baked into the
compiled graph; a non-const one is a device tensor that ``TrainingSession.updateOptimizerFromHost``
rewrites (PopART's ``optimizerFromHost`` program). Values are given per session (``default*``
keys) and per weight (``insertSpecific``).

The update equations are PopART's (``willow/include/popart/sgd.hpp``, SDK 3.x), with mm
momentum, dm dampening, wd weight decay, lr learning rate, ls loss scaling, vs velocity scaling,
A the accumulation factor and R the replication factor. How the micro-batches' and replicas'
gradients are combined is a :class:`Reduction` (``accumulationAndReplicationReductionType`` and
``meanAccumulationAndReplicationReductionStrategy``): with Sum they are summed; with Mean and
the ``Post`` strategy (the default) summed and the update divided by A and R; with
``PostAndLoss`` the loss gradient is divided by R and the update by A; with ``Running`` the
gradient accumulator keeps a running mean and the replicas all-reduce a mean. Below, ``af`` and
``rf`` are the divisors that apply (1 when summing).

- without momentum ("SGD0"): the replicas' gradients all-reduced, then
  ``w <- w * (1 - lr (1 - dm) wd) - g * lr (1 - dm) / (ls rf)``;
- with momentum or accumulation, ``SGDAccumulatorAndMomentum.Combined`` ("SGD1"): the velocity
  ``v`` starts at ``(1 - dm) wd vs w0``; each micro-batch ``v += (1 - dm) vs / (ls af) * g`` (the
  replicas' gradients all-reduced first without accumulation, the velocity itself all-reduced
  after the last micro-batch with it, which scales it by R); ``w <- w - lr / (vs R') * v``;
  ``v <- v * mm / R' + (1 - dm) wd vs * w`` (R' = R with accumulation, else 1). With ``nesterov``
  the (all-reduced) gradients are summed in ``Accl___<w>_nesterovGrad`` as well and the weight
  step is ``w <- w - lr / (vs R') * (vs R' (a / ls + wd w) + mm v)`` (``sgd.hpp``: the nesterov
  term takes the gradient sum ``a`` un-divided by A and R even with Mean reduction).
- ``SGDAccumulatorAndMomentum.Separate`` ("SGD2"): the gradient accumulator and the velocity
  are two tensors (``Accum___`` of ``accumType``, ``Accl1___`` of ``accl1Type``): the velocity
  starts at 0; each batch ``v <- v mm + (1 - dm) wd vs w``, ``v += (1 - dm) vs / (ls af rf) * a``
  (``a`` the accumulated, all-reduced gradient), ``w <- w - lr / vs * v`` (nesterov:
  ``w <- w - lr / vs * (vs (a / ls + wd w) + mm v)``), then ``a <- 0``.

These match ``torch.optim.SGD`` whenever ``dm == 0`` (PyTorch does not dampen its first step).

Adam and Adaptive follow PopART's ``adam.hpp`` / ``adaptive.hpp`` (equations in
:mod:`openipu.popart.transforms.optimizer`); their gradient is first un-scaled by
``1 / (ls af rf)`` (``gradientScaling``; Adam with ``scaled_optimizer_state``: ``1 / (af rf)``,
the state keeps the loss scaling and ``eps`` is scaled by ``ls`` instead).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from openipu.popart.errors import popart_exception


@dataclass(frozen=True)
class Reduction:
    """How a weight update combines the gradients of ``accumulation`` micro-batches on each of
    ``replicas`` replicas (PopART's ``Optimizer::setFactorsFromOptions``): summed, or with
    ``mean`` (``ReductionType.Mean``) by ``strategy``, a ``MeanReductionStrategy`` name:
    ``Post`` divides the update by A and R, ``PostAndLoss`` the update by A and the loss
    gradient by R, ``Running`` keeps a running mean in the accumulator and all-reduces a mean."""

    accumulation: int = 1
    replicas: int = 1
    mean: bool = False
    strategy: str = "Post"
    #: the replicas the gradient reduction sums over (0: all of them); fewer for a replica-grouped
    #: weight (``popart.VariableSettings``), reduced within its group. The Mean divisors stay
    #: ``replicas``: a grouped weight's update is the gradient of the mean over every replica's loss.
    group: int = 0

    @property
    def reduced(self) -> int:
        """Replicas the gradient all-reduce sums over."""
        return self.group or self.replicas

    @property
    def accumulating(self) -> bool:
        return self.accumulation > 1

    @property
    def running(self) -> bool:
        """The accumulator keeps a running mean (Accumulate Mean) and the replicas all-reduce a mean."""
        return self.mean and self.strategy == "Running"

    @property
    def post_af(self) -> float:
        """The accumulation divisor applied in the update (PopART's ``postMeanAccumulation``)."""
        return float(self.accumulation) if self.mean and self.accumulating and not self.running else 1.0

    @property
    def post_rf(self) -> float:
        """The replication divisor applied in the update (``postMeanReplication``)."""
        return float(self.replicas) if self.mean and self.strategy == "Post" else 1.0

    @property
    def loss_rf(self) -> float:
        """The replication divisor applied to the loss gradient (``lossMeanReplication``)."""
        return float(self.replicas) if self.mean and self.strategy == "PostAndLoss" else 1.0


class SGDAccumulatorAndMomentum(enum.Enum):
    """How SGD keeps its gradient accumulator and velocity (PopART's enum)."""

    Combined = 0
    Separate = 1


class WeightDecayMode(enum.Enum):
    """``popart.WeightDecayMode``: ``Decay`` (decoupled, AdamW) or ``L2Regularization`` (``g += wd w``)."""

    Decay = 0
    L2Regularization = 1


class AdamMode(enum.Enum):
    """``popart.AdamMode``."""

    Adam = 0
    AdamNoBias = 1
    Lamb = 2
    LambNoBias = 3
    AdaMax = 4


class AdaptiveMode(enum.Enum):
    """``popart.AdaptiveMode``."""

    AdaGrad = 0
    RMSProp = 1
    CenteredRMSProp = 2
    AdaDelta = 3


class ClipNormSettings:
    """``popart.ClipNormSettings(weightIds, maxNorm)``: clip the gradients of ``weightIds`` (a
    list of weight ids) so that their global L2 norm is at most ``maxNorm`` (PopART's
    ``ClipWeightGradientsByNorm`` transform). ``clipWeights(weightIds, maxNorm)`` is the same;
    ``clipAllWeights(maxNorm)`` takes every trained weight."""

    def __init__(self, weightIds=(), maxNorm: float = 1.0, _all: bool = False):  # noqa: N803
        if isinstance(weightIds, str):
            raise popart_exception("ClipNormSettings takes a list of weight ids, not one id: wrap it in a list")
        self.weightIds = [str(w) for w in weightIds]
        self.maxNorm = float(maxNorm)
        self._all = bool(_all)

    @staticmethod
    def clipWeights(weightIds, maxNorm: float) -> "ClipNormSettings":  # noqa: N802,N803
        return ClipNormSettings(weightIds, maxNorm)

    @staticmethod
    def clipAllWeights(maxNorm: float) -> "ClipNormSettings":  # noqa: N802,N803
        return ClipNormSettings((), maxNorm, _all=True)

    def clips_all(self) -> bool:
        return self._all

    def __eq__(self, other):
        return isinstance(other, ClipNormSettings) and \
            (self.weightIds, self.maxNorm, self._all) == (other.weightIds, other.maxNorm, other._all)

    def __repr__(self):
        return f"ClipNormSettings({'all weights' if self._all else self.weightIds}, maxNorm={self.maxNorm})"


class OptimizerValue:
    """``popart.OptimizerValue(value=0.0, isConst=True)``: one hyper-parameter."""

    def __init__(self, val=0.0, isConst: bool = True):  # noqa: N803
        if isinstance(val, tuple):
            val, isConst = val
        self._val = float(val)
        self._const = bool(isConst)

    def val(self) -> float:
        return self._val

    def isConst(self) -> bool:  # noqa: N802
        return self._const

    def __eq__(self, other):
        return isinstance(other, OptimizerValue) and (self._val, self._const) == (other._val, other._const)

    def __repr__(self):
        return f"OptimizerValue({self._val}, {'const' if self._const else 'non-const'})"


def _value_dict(pyd: dict, where: str) -> dict:
    out = {}
    for k, v in pyd.items():
        if isinstance(v, OptimizerValue):
            out[k] = v
            continue
        if not isinstance(v, tuple) or len(v) != 2:
            raise popart_exception(f"A value in the optimizer map must be a py::tuple (in {where})")
        out[k] = OptimizerValue(float(v[0]), bool(v[1]))
    return out


class Optimizer:
    """Base of the optimizers: per-session defaults, per-weight values, loss scaling."""

    #: key -> (default value, const by default)
    DEFAULTS: dict = {}
    NAME = "Optimizer"

    def __init__(self, values: dict, where: str):
        vals = _value_dict(values, where)
        for k in vals:
            if k not in self.DEFAULTS:
                raise popart_exception(f"Invalid {self.NAME} key, {k}, the allowed keys are "
                                       f"( {' '.join(self.DEFAULTS)} )")
        self._defaults = {k: vals.get(k, OptimizerValue(*d)) for k, d in self.DEFAULTS.items()}
        self._specific: dict[str, dict] = {}
        self.clip_norm_settings = []

    # -- values ---------------------------------------------------------------------------
    def _specific_key(self, key: str) -> str:
        """``defaultLearningRate`` -> ``learningRate``; keys without ``default`` stay."""
        if not key.startswith("default"):
            return key
        return key[len("default"):][0].lower() + key[len("default") + 1:]

    def insertSpecific(self, weightId: str, values: dict) -> None:  # noqa: N802,N803
        """Hyper-parameters for one weight (keys without ``default``: ``learningRate`` ...)."""
        vals = _value_dict(values, "getOptimizerValueDictionary")
        allowed = [self._specific_key(k) for k in self.DEFAULTS if k != "lossScaling"]
        for k in vals:
            if k not in allowed:
                raise popart_exception(f"Invalid {self.NAME} key, {k}, the allowed keys are ( {' '.join(allowed)} )")
        self._specific[weightId] = vals

    def hasSpecific(self, weightId: str = None) -> bool:  # noqa: N802,N803
        return bool(self._specific) if weightId is None else weightId in self._specific

    def value(self, key: str, weight: str | None = None) -> OptimizerValue:
        """The ``default*`` ``key``'s value for ``weight`` (its specific value if inserted)."""
        if weight is not None and key != "lossScaling":
            spec = self._specific.get(weight, {}).get(self._specific_key(key))
            if spec is not None:
                return spec
        return self._defaults[key]

    def lossScaling(self) -> OptimizerValue:  # noqa: N802
        return self._defaults["lossScaling"]

    def getLossScalingVal(self) -> float:  # noqa: N802
        return self.lossScaling().val()

    def check_compatible(self, new: "Optimizer") -> None:
        """PopART's rule for ``updateOptimizerFromHost``: same type, same weights with specific
        values, and const values unchanged. Raises ``popart_exception``."""
        if list(new.clip_norm_settings) != list(self.clip_norm_settings):
            raise popart_exception("Clip norm settings do not match.")
        if type(new) is not type(self):
            raise popart_exception(f"Can not update optimizer of type {self.NAME} with an optimizer of type "
                                   f"{new.NAME}: create a new session to change the optimizer type")
        if set(new._specific) != set(self._specific):
            raise popart_exception("The new optimizer has specific values for other weights than the session's "
                                   "optimizer; insertSpecific the same weights in both")
        for w in [None, *self._specific]:
            for k in self.DEFAULTS:
                a, b = self.value(k, w), new.value(k, w)
                if a.isConst() and not b.isConst():
                    raise popart_exception(f"Can not replace a constant value with a non constant value. ({k})")
                if a.isConst() and a.val() != b.val():
                    raise popart_exception(f"Values are constant but do not match. ({k}: {a.val()} vs {b.val()})")
                if not a.isConst() and b.isConst():
                    raise popart_exception(f"Can not replace a non constant value with a constant value. ({k})")


class SGD(Optimizer):
    """``popart.SGD(values, clip_norm_settings=[], accumulatorAndMomentum=Combined, ...)``.

    ``values``: ``{key: (value, isConst)}`` with keys ``defaultLearningRate`` (0.1),
    ``defaultWeightDecay`` (0), ``defaultMomentum`` (0), ``defaultDampening`` (0),
    ``defaultVelocityScaling`` (1), ``lossScaling`` (1), ``nesterov`` (0); absent keys are const.
    Raises ``popart_exception`` ("Invalid SGD key, ...", "A value in the optimizer map must be a
    py::tuple ...") as PopART does. Update equations: module docstring.
    """

    DEFAULTS = {"defaultLearningRate": (0.1, True), "defaultWeightDecay": (0.0, True),
                "defaultMomentum": (0.0, True), "defaultDampening": (0.0, True),
                "defaultVelocityScaling": (1.0, True), "lossScaling": (1.0, True), "nesterov": (0.0, True)}
    NAME = "SGD"

    def __init__(self, pyd: dict | None = None, clip_norm_settings=(), accumulatorAndMomentum=None,  # noqa: N803
                 accumType=None, accl1Type=None, debugContext: str = "sgd"):  # noqa: N803
        if pyd is not None and not isinstance(pyd, dict):
            raise popart_exception("SGD expects a dict {key: (value, isConst)}, e.g. "
                                   "popart.SGD({'defaultLearningRate': (0.01, True)}); for a constant learning rate "
                                   "alone use popart.ConstSGD(0.01)")
        pyd = dict(pyd or {})
        super().__init__(pyd, "getOptimizerValueDictionary")
        self.clip_norm_settings = list(clip_norm_settings)
        self.accumulator_and_momentum = accumulatorAndMomentum or SGDAccumulatorAndMomentum.Combined
        self.accum_type, self.accl1_type = _dtype_name(accumType), _dtype_name(accl1Type)

    def learningRates(self):  # noqa: N802
        return self._per("defaultLearningRate")

    def weightDecays(self):  # noqa: N802
        return self._per("defaultWeightDecay")

    def momentums(self):
        return self._per("defaultMomentum")

    def dampenings(self):
        return self._per("defaultDampening")

    def velocityScalings(self):  # noqa: N802
        return self._per("defaultVelocityScaling")

    def nesterov(self):
        return self._per("nesterov")

    def _per(self, key):
        return _ValueMap(self, key)

    def uses_velocity(self, weight: str | None = None, accumulating: bool = False) -> bool:
        """Whether ``weight`` needs a velocity tensor, i.e. the SGD1 form (PopART: gradient
        accumulation, or a non-zero or non-const momentum)."""
        mm = self.value("defaultMomentum", weight)
        return accumulating or not mm.isConst() or mm.val() != 0.0

    def compound_scalars(self, weight: str, red: Reduction = Reduction()) -> dict:
        """:func:`sgd_scalars`."""
        return sgd_scalars(self, weight, red)

    def __repr__(self):
        return f"SGD({ {k: (v.val(), v.isConst()) for k, v in self._defaults.items()} })"


class ConstSGD(SGD):
    """``popart.ConstSGD(learning_rate, weight_decay=0.0, loss_scaling=1.0, clip_norm_settings=[])``:
    SGD without momentum whose values are all const."""

    def __init__(self, learning_rate: float, weight_decay: float = 0.0, loss_scaling: float = 1.0,
                 clip_norm_settings=()):
        super().__init__({"defaultLearningRate": (float(learning_rate), True),
                          "defaultWeightDecay": (float(weight_decay), True),
                          "lossScaling": (float(loss_scaling), True)}, clip_norm_settings)

    def insertSpecific(self, weightId, values):  # noqa: N802,N803
        raise popart_exception("ConstSGD does not support insertSpecific: use popart.SGD for per-weight values")


class _ValueMap:
    """PopART's ``OptimizerValueMap``: ``getDefault()``, ``get(id)``, ``hasSpecific(id)``."""

    def __init__(self, opt: Optimizer, key: str):
        self._opt, self._key = opt, key

    def getDefault(self) -> OptimizerValue:  # noqa: N802
        return self._opt.value(self._key)

    def get(self, weightId: str) -> OptimizerValue:  # noqa: N803
        return self._opt.value(self._key, weightId)

    def hasSpecific(self, weightId: str) -> bool:  # noqa: N802,N803
        return self._opt.hasSpecific(weightId)


# ---------------------------------------------------------------------------------------------
# compound scalars (PopART's ``compoundscalarhelper``): what the weight update ops read
# ---------------------------------------------------------------------------------------------
def sgd_scalars(opt: SGD, weight: str, red: Reduction = Reduction()) -> dict[str, tuple[float, bool]]:
    """The compound scalars of ``weight``'s SGD update under the reduction ``red``: name ->
    (value, isConst), PopART's ``compoundscalarhelper`` (equations: module docstring).

    Without momentum: ``weightDecayScaleFactor0``, ``scaledLearningRate0``. With momentum:
    ``dampeningScaleFactor1``, ``scaledLearningRate1``, ``scaledMomentum1``,
    ``scaledWeightDecay1`` (SGD2 reuses the names for its dpsf2, slr2, smm2), plus with nesterov
    ``nesterovGradScaleFactor1`` (``vs R' / ls``), ``nesterovWeightDecay1`` (``vs R' wd``) and
    ``momentum``. A scalar is const when every hyper-parameter it is made from is.
    """
    v = {k: opt.value(k, weight) for k in opt.DEFAULTS}
    lr, wd, mm, dm, vs, ls = (v[k].val() for k in ("defaultLearningRate", "defaultWeightDecay", "defaultMomentum",
                                                    "defaultDampening", "defaultVelocityScaling", "lossScaling"))

    def const(*keys):
        return all(v[k].isConst() for k in keys)
    if not opt.uses_velocity(weight, red.accumulating):
        return {"weightDecayScaleFactor0": (1.0 - lr * (1.0 - dm) * wd,
                                            const("defaultLearningRate", "defaultDampening", "defaultWeightDecay")),
                "scaledLearningRate0": (lr * (1.0 - dm) / (ls * red.post_rf),
                                        const("defaultLearningRate", "defaultDampening", "lossScaling"))}
    if opt.accumulator_and_momentum == SGDAccumulatorAndMomentum.Separate:
        r_velocity = 1.0
        dpsf = (1.0 - dm) * vs / (ls * red.post_af * red.post_rf)
    else:
        # SGD1: with accumulation the replicas all-reduce (sum) the velocity, so it carries a
        # factor R the learning rate and momentum take out; without, they all-reduce the gradient
        # (the velocity's all-reduce sums ``red.reduced`` replicas: all, or a grouped weight's group)
        r_velocity = float(red.reduced) if red.accumulating else 1.0
        af = float(red.accumulation) if red.mean else 1.0
        if red.accumulating:
            rf = float(red.reduced) if not red.mean or red.strategy == "PostAndLoss" else \
                red.reduced / red.replicas
        else:
            rf = 1.0 / red.replicas if red.mean and red.strategy != "PostAndLoss" else 1.0
        dpsf = (1.0 - dm) * vs * rf / (ls * af)
    out = {"dampeningScaleFactor1": (dpsf, const("defaultDampening", "defaultVelocityScaling", "lossScaling")),
           "scaledLearningRate1": (lr / (vs * r_velocity), const("defaultLearningRate", "defaultVelocityScaling")),
           "scaledMomentum1": (mm / r_velocity, const("defaultMomentum")),
           "scaledWeightDecay1": ((1.0 - dm) * wd * vs,
                                  const("defaultDampening", "defaultWeightDecay", "defaultVelocityScaling"))}
    if v["nesterov"].val():
        out["nesterovGradScaleFactor1"] = (vs * r_velocity / ls, const("defaultVelocityScaling", "lossScaling"))
        out["nesterovWeightDecay1"] = (vs * r_velocity * wd, const("defaultVelocityScaling", "defaultWeightDecay"))
        out["momentum"] = (mm, const("defaultMomentum"))
    return out


def initial_velocity(opt: SGD, weight: str, w0: np.ndarray) -> np.ndarray:
    """SGD1's initial velocity ``(1 - dm) wd vs w0`` (PopART precomputes terms 1 and 3)."""
    wd, dm, vs = (opt.value(k, weight).val() for k in ("defaultWeightDecay", "defaultDampening",
                                                       "defaultVelocityScaling"))
    scale = (1.0 - dm) * wd * vs
    return (np.asarray(w0, np.float32) * scale).astype(w0.dtype) if scale else np.zeros_like(w0)



# ---------------------------------------------------------------------------------------------
# Adam and Adaptive
# ---------------------------------------------------------------------------------------------
def _dtype_name(t) -> str | None:
    """A ``popart.DataType`` / string / None as a data type name (None: UNDEFINED)."""
    if t is None:
        return None
    name = getattr(t, "name", str(t)).split(".")[-1].upper()
    return None if name == "UNDEFINED" else name


def _enum(cls, v, what):
    if isinstance(v, cls):
        return v
    try:
        return cls[str(v).split(".")[-1]]
    except KeyError:
        raise popart_exception(f"Invalid {what} '{v}': expected one of {', '.join(m.name for m in cls)}") from None


def _gradient_scaling(v: dict, red: Reduction, scaled_state: bool = False) -> tuple[float, bool]:
    """``1 / (ls * af * rf)``: un-scales the (reduced, loss-scaled) gradient; const iff ``ls``
    is. With a scaled optimizer state the loss scaling stays: ``1 / (af * rf)``."""
    ls = v["lossScaling"]
    if scaled_state:
        return 1.0 / (red.post_af * red.post_rf), True
    return 1.0 / (ls.val() * red.post_af * red.post_rf), ls.isConst()


class _StateOptimizer(Optimizer):
    """Adam / Adaptive: per-weight state tensors of types ``accl1Type`` ... (FLOAT by default,
    the weight's type when UNDEFINED), a weight decay mode, and compound scalars that are the
    hyper-parameters themselves plus ``gradientScaling``."""

    #: hyper-parameter key -> compound scalar name
    SCALARS: dict = {}
    #: the state keeps the loss scaling (Adam's ``scaled_optimizer_state``)
    scaled_optimizer_state = False

    def __init__(self, values: dict | None, mode: enum.Enum, weight_decay_mode):
        """``values`` as the bindings take them; raises ``popart_exception`` for a non-dict
        ``values`` and an unknown ``WeightDecayMode``."""
        if values is not None and not isinstance(values, dict):
            raise popart_exception(f"{self.NAME} expects a dict {{key: (value, isConst)}}, e.g. "
                                   f"popart.{self.NAME}({{'defaultLearningRate': (0.01, True)}})")
        super().__init__(dict(values or {}), "getOptimizerValueDictionary")
        self.mode = mode
        self.weight_decay_mode = _enum(WeightDecayMode, weight_decay_mode, "WeightDecayMode")

    def compound_scalars(self, weight: str, red: Reduction = Reduction()) -> dict:
        """name -> (value, isConst) of ``weight``'s update: every hyper-parameter of
        :attr:`SCALARS` and ``gradientScaling`` (:func:`_gradient_scaling`). Adam with
        ``scaled_optimizer_state`` scales ``eps`` (and, in L2Regularization mode, ``weightDecay``)
        by the loss scaling instead (PopART's ``AdamEpsHelper`` / ``AdamWeightDecayHelper``)."""
        v = {k: self.value(k, weight) for k in self.DEFAULTS}
        out = {name: (v[k].val(), v[k].isConst()) for k, name in self.SCALARS.items()}
        scaled = self.scaled_optimizer_state
        out["gradientScaling"] = _gradient_scaling(v, red, scaled)
        if scaled:
            ls = v["lossScaling"]
            scale = [("eps", "defaultEps")]
            if self.weight_decay_mode == WeightDecayMode.L2Regularization:
                scale.append(("weightDecay", "defaultWeightDecay"))
            for name, key in scale:
                out[name] = (v[key].val() * ls.val(), v[key].isConst() and ls.isConst())
        return out

    def __repr__(self):
        return f"{self.NAME}({ {k: (v.val(), v.isConst()) for k, v in self._defaults.items()} }, {self.mode.name})"


class Adam(_StateOptimizer):
    """``popart.Adam(values, mode=AdamMode.Adam, weight_decay_mode=WeightDecayMode.Decay,
    accum_type=UNDEFINED, accl1_type=FLOAT, accl2_type=FLOAT, clip_norm_settings=[],
    scaled_optimizer_state=False, debugContext="adam")`` (PopART's ``adam.hpp``).

    ``values``: ``{key: (value, isConst)}`` with keys ``defaultLearningRate`` (0.1),
    ``defaultWeightDecay`` (0), ``defaultBeta1`` (0.9), ``defaultBeta2`` (0.999),
    ``defaultEps`` (1e-6), ``lossScaling`` (1), ``defaultMaxWeightNorm`` (10, Lamb's phi clip).
    Modes ``Adam``, ``AdamNoBias`` (no bias correction), ``AdaMax``, ``Lamb``, ``LambNoBias``;
    ``WeightDecayMode.Decay`` is decoupled weight decay (AdamW), ``L2Regularization`` adds
    ``wd * w`` to the gradient. State per weight: ``Accl1___<w>`` (first moment, accl1_type),
    ``Accl2___<w>`` (second moment, accl2_type), ``Step___<w>`` (FLOAT step counter).
    ``scaled_optimizer_state``: the moments keep the loss scaling (``m`` scaled by ``ls``, ``v`` by
    ``ls^2``; for fp16 state) and ``eps`` is scaled by ``ls``; a non-const loss scaling then
    rescales the moments by ``ls / previous ls`` when it changes (``PreviousLossScaling___``).
    Raises ``popart_exception`` for an unknown key ("Invalid Adam key, ...") or mode.
    """

    DEFAULTS = {"defaultLearningRate": (0.1, True), "defaultWeightDecay": (0.0, True),
                "defaultBeta1": (0.9, True), "defaultBeta2": (0.999, True), "defaultEps": (1e-6, True),
                "lossScaling": (1.0, True), "defaultMaxWeightNorm": (10.0, True)}
    SCALARS = {"defaultLearningRate": "learningRate", "defaultWeightDecay": "weightDecay",
               "defaultBeta1": "beta1", "defaultBeta2": "beta2", "defaultEps": "eps",
               "defaultMaxWeightNorm": "maxWeightNorm"}
    NAME = "Adam"

    def __init__(self, values: dict | None = None, mode=AdamMode.Adam, weight_decay_mode=WeightDecayMode.Decay,
                 accum_type=None, accl1_type="FLOAT", accl2_type="FLOAT", clip_norm_settings=(),
                 scaled_optimizer_state: bool = False, debugContext: str = "adam"):  # noqa: N803
        super().__init__(values, _enum(AdamMode, mode, "AdamMode"), weight_decay_mode)
        self.accum_type, self.accl1_type, self.accl2_type = (_dtype_name(t) for t in (accum_type, accl1_type,
                                                                                        accl2_type))
        self.clip_norm_settings = list(clip_norm_settings)
        self.scaled_optimizer_state = bool(scaled_optimizer_state)
        # not PopART's: the TensorFlow route sets it for Keras's Adam, which adds eps to sqrt(v)
        # before the bias correction: x = m / (sqrt(v) + eps) * sqrt(1 - b2^t) / (1 - b1^t)
        self.eps_before_correction = False
        # not PopART's: the TensorFlow route sets it for Keras 3's Adam, whose second moment of an
        # embedding table adds each lookup's squared gradient (TensorFlow's IndexedSlices) instead
        # of squaring their sum (transforms.optimizer._per_lookup_squares)
        self.per_lookup_second_moment = False

    def learningRates(self):  # noqa: N802
        return _ValueMap(self, "defaultLearningRate")

    def weightDecays(self):  # noqa: N802
        return _ValueMap(self, "defaultWeightDecay")

    def beta1s(self):
        return _ValueMap(self, "defaultBeta1")

    def beta2s(self):
        return _ValueMap(self, "defaultBeta2")

    def epss(self):
        return _ValueMap(self, "defaultEps")

    def maxWeightNorms(self):  # noqa: N802
        return _ValueMap(self, "defaultMaxWeightNorm")


class Adaptive(_StateOptimizer):
    """``popart.Adaptive(values, mode=AdaptiveMode.RMSProp, weight_decay_mode=WeightDecayMode.Decay,
    accum_type=UNDEFINED, accl1_type=FLOAT, accl2_type=FLOAT, accl3_type=UNDEFINED,
    rmsprop_tf_variant=False, debugContext="adaptive")`` (PopART's ``adaptive.hpp``).

    ``values`` keys: ``defaultLearningRate`` (0.01), ``defaultWeightDecay`` (0),
    ``defaultAlpha`` (0.99), ``defaultMomentum`` (0), ``defaultEps`` (1e-6), ``lossScaling`` (1).
    Modes ``AdaGrad``, ``RMSProp``, ``CenteredRMSProp``, ``AdaDelta``. State per weight:
    ``Accl1___<w>``, ``Accl2___<w>`` (CenteredRMSProp, AdaDelta), ``Accl3___<w>`` (momentum > 0).
    """

    DEFAULTS = {"defaultLearningRate": (0.01, True), "defaultWeightDecay": (0.0, True),
                "defaultAlpha": (0.99, True), "defaultMomentum": (0.0, True), "defaultEps": (1e-6, True),
                "lossScaling": (1.0, True)}
    SCALARS = {"defaultLearningRate": "learningRate", "defaultWeightDecay": "weightDecay",
               "defaultAlpha": "alpha", "defaultMomentum": "momentum", "defaultEps": "eps"}
    NAME = "Adaptive"

    def __init__(self, values: dict | None = None, mode=AdaptiveMode.RMSProp, weight_decay_mode=WeightDecayMode.Decay,
                 accum_type=None, accl1_type="FLOAT", accl2_type="FLOAT", accl3_type=None,
                 rmsprop_tf_variant: bool = False, debugContext: str = "adaptive"):  # noqa: N803
        super().__init__(values, _enum(AdaptiveMode, mode, "AdaptiveMode"), weight_decay_mode)
        self.accum_type, self.accl1_type, self.accl2_type, self.accl3_type = (
            _dtype_name(t) for t in (accum_type, accl1_type, accl2_type, accl3_type))
        self.rmsprop_tf_variant = bool(rmsprop_tf_variant)
        # not PopART's: set by the TensorFlow route for Keras 3's RMSprop (see Adam's)
        self.per_lookup_second_moment = False
