"""``poptorch.optim`` (``research/poptorch.md`` 1.8) and the translation of an optimizer to
PopART's (:func:`to_popart`).

``SGD``, ``Adam``, ``AdamW``, ``RMSprop`` subclass PyTorch's with PopTorch's extra arguments
(``loss_scaling``, ``velocity_scaling``, ``use_combined_accum``, ``accum_type``, ``*_accum_type``,
``max_grad_norm``, ``bias_correction``, ``use_tf_variant``); ``LAMB`` is PopTorch's own. Their
``step()`` on the CPU is PyTorch's; on the IPU the update is PopART's. Plain ``torch.optim``
SGD / Adam / AdamW / RMSprop are accepted too. The learning rate is always a variable (changed by
``setOptimizer`` without recompiling); the other hyper-parameters are compiled in as constants
unless passed explicitly to a ``poptorch.optim`` class (PopTorch's rule).
"""

from __future__ import annotations

import torch

from openipu import popart
from openipu.poptorch.errors import Error


class VariableAttributes:
    """``opt.variable_attrs`` (PopTorch's ``poptorch.optim.VariableAttributes``): which
    hyper-parameters are variables (changed by ``setOptimizer`` without recompiling) and which
    are compiled in as constants. ``_allowed_attributes``: the names the optimizer has (its
    ``defaults`` and PopTorch's extra arguments)."""

    def __init__(self, variable_attributes, allowed_attributes):
        self._variable_attributes = list(variable_attributes)
        self._allowed_attributes = list(allowed_attributes)

    def isConstant(self, attr: str) -> bool:  # noqa: N802
        """Whether ``attr`` is compiled in as a constant."""
        return attr not in self._variable_attributes

    def markAsConstant(self, attr: str) -> None:  # noqa: N802
        """Compile ``attr`` in as a constant. Asserts "Unknown attribute X, allowed values: [...]"."""
        assert attr in self._allowed_attributes, f"Unknown attribute {attr}, allowed values: {self._allowed_attributes}"
        self._variable_attributes = [a for a in self._variable_attributes if a != attr]

    def markAsVariable(self, attr: str) -> None:  # noqa: N802
        """Make ``attr`` a variable. Asserts as :meth:`markAsConstant`."""
        assert attr in self._allowed_attributes, f"Unknown attribute {attr}, allowed values: {self._allowed_attributes}"
        if attr not in self._variable_attributes:
            self._variable_attributes.append(attr)

    def __contains__(self, attr) -> bool:      # openipu: "is a variable"
        return attr in self._variable_attributes

    def __iter__(self):                         # openipu: the variable attributes
        return iter(list(self._variable_attributes))

    def __repr__(self):
        return f"VariableAttributes(variables={self._variable_attributes})"


class Optimizer:
    """Mixin of the ``poptorch.optim`` classes: the extra arguments and which hyper-parameters
    are variables (``variable_attrs``, a :class:`VariableAttributes`: the arguments passed
    explicitly, and ``lr``)."""

    _EXTRA: dict = {}

    def _init_extra(self, given: dict, extra: dict):
        variables = ["lr"] + [k for k, v in given.items() if v is not None] + \
            [k for k, v in extra.items() if v is not None]
        for k, default in self._EXTRA.items():
            v = extra.get(k)
            setattr(self, k, default if v is None else v)
        self.variable_attrs = VariableAttributes(dict.fromkeys(variables), list(self.defaults) + list(self._EXTRA))

    @property
    def variable_attrs(self) -> VariableAttributes:
        return self._variable_attrs

    @variable_attrs.setter
    def variable_attrs(self, value) -> None:
        """A :class:`VariableAttributes`, or the names of the variable attributes (a saved
        optimizer's)."""
        if not isinstance(value, VariableAttributes):
            value = VariableAttributes(list(value), list(self.defaults) + list(self._EXTRA))
        self._variable_attrs = value

    def markAsConstant(self, attr: str):  # noqa: N802
        self.variable_attrs.markAsConstant(attr)

    def markAsVariable(self, attr: str):  # noqa: N802
        self.variable_attrs.markAsVariable(attr)


def _kw(locals_: dict, names) -> dict:
    return {k: locals_[k] for k in names if locals_[k] is not None}


class SGD(Optimizer, torch.optim.SGD):
    """``poptorch.optim.SGD``: PyTorch's SGD plus ``loss_scaling``, ``velocity_scaling`` (the
    combined variant only), ``use_combined_accum`` (default False: PopART's separate accumulator
    and velocity, SGD2), ``accum_type``, ``velocity_accum_type``, ``max_grad_norm``."""

    _EXTRA = {"loss_scaling": 1.0, "velocity_scaling": 1.0, "use_combined_accum": False, "accum_type": None,
              "velocity_accum_type": None, "max_grad_norm": None}

    def __init__(self, params, lr=None, momentum=None, dampening=None, weight_decay=None, nesterov=None,
                 maximize=None, foreach=None, differentiable=None, loss_scaling=None, velocity_scaling=None,
                 use_combined_accum=None, accum_type=None, velocity_accum_type=None, max_grad_norm=None):
        given = _kw(locals(), ("momentum", "dampening", "weight_decay", "nesterov"))
        torch.optim.SGD.__init__(self, params, lr=0.01 if lr is None else lr, **given)
        self._init_extra(given, dict(loss_scaling=loss_scaling, velocity_scaling=velocity_scaling,
                                     use_combined_accum=use_combined_accum, accum_type=accum_type,
                                     velocity_accum_type=velocity_accum_type, max_grad_norm=max_grad_norm))


class Adam(Optimizer, torch.optim.Adam):
    """``poptorch.optim.Adam``: PyTorch's Adam (L2 weight decay) plus ``loss_scaling``,
    ``accum_type``, ``first_order_momentum_accum_type``, ``second_order_momentum_accum_type``,
    ``max_grad_norm``."""

    _EXTRA = {"loss_scaling": 1.0, "accum_type": None, "first_order_momentum_accum_type": torch.float32,
              "second_order_momentum_accum_type": torch.float32, "max_grad_norm": None}

    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None, amsgrad=None, foreach=None,
                 maximize=None, capturable=None, differentiable=None, fused=None, loss_scaling=None,
                 accum_type=None, first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 max_grad_norm=None):
        given = _kw(locals(), ("betas", "eps", "weight_decay", "amsgrad"))
        torch.optim.Adam.__init__(self, params, lr=1e-3 if lr is None else lr, **given)
        self._init_extra(given, dict(loss_scaling=loss_scaling, accum_type=accum_type,
                                     first_order_momentum_accum_type=first_order_momentum_accum_type,
                                     second_order_momentum_accum_type=second_order_momentum_accum_type,
                                     max_grad_norm=max_grad_norm))


class AdamW(Optimizer, torch.optim.AdamW):
    """``poptorch.optim.AdamW``: decoupled weight decay, plus Adam's extras and
    ``bias_correction`` (default True)."""

    _EXTRA = {**Adam._EXTRA, "bias_correction": True}

    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None, amsgrad=None, foreach=None,
                 maximize=None, capturable=None, differentiable=None, fused=None, loss_scaling=None,
                 bias_correction=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None, max_grad_norm=None):
        given = _kw(locals(), ("betas", "eps", "weight_decay", "amsgrad"))
        torch.optim.AdamW.__init__(self, params, lr=1e-3 if lr is None else lr, **given)
        self._init_extra(given, dict(loss_scaling=loss_scaling, bias_correction=bias_correction,
                                     accum_type=accum_type,
                                     first_order_momentum_accum_type=first_order_momentum_accum_type,
                                     second_order_momentum_accum_type=second_order_momentum_accum_type,
                                     max_grad_norm=max_grad_norm))


class RMSprop(Optimizer, torch.optim.RMSprop):
    """``poptorch.optim.RMSprop`` plus ``loss_scaling``, the accumulation types and
    ``use_tf_variant`` (epsilon inside the square root)."""

    _EXTRA = {"loss_scaling": 1.0, "accum_type": None, "first_order_momentum_accum_type": torch.float32,
              "second_order_momentum_accum_type": torch.float32, "use_tf_variant": False}

    def __init__(self, params, lr=None, alpha=None, eps=None, weight_decay=None, momentum=None, centered=None,
                 capturable=None, foreach=None, maximize=None, differentiable=None, loss_scaling=None,
                 accum_type=None, first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 use_tf_variant=None):
        given = _kw(locals(), ("alpha", "eps", "weight_decay", "momentum", "centered"))
        torch.optim.RMSprop.__init__(self, params, lr=1e-2 if lr is None else lr, **given)
        self._init_extra(given, dict(loss_scaling=loss_scaling, accum_type=accum_type,
                                     first_order_momentum_accum_type=first_order_momentum_accum_type,
                                     second_order_momentum_accum_type=second_order_momentum_accum_type,
                                     use_tf_variant=use_tf_variant))


class LAMB(Optimizer, torch.optim.Optimizer):
    """``poptorch.optim.LAMB(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
    bias_correction=True, loss_scaling=1.0, max_weight_norm=65500, accum_type=float32,
    first_order_momentum_accum_type=float32, second_order_momentum_accum_type=float32)``: Adam
    moments, decoupled weight decay and the trust ratio ``min(|w|, max_weight_norm) / |u|``
    (PopART's Lamb). ``step()`` runs the same update on the CPU."""

    _EXTRA = {"loss_scaling": 1.0, "max_weight_norm": 65500.0, "bias_correction": True, "accum_type": torch.float32,
              "first_order_momentum_accum_type": torch.float32, "second_order_momentum_accum_type": torch.float32}

    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None, bias_correction=None,
                 loss_scaling=None, max_weight_norm=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None):
        given = _kw(locals(), ("betas", "eps", "weight_decay"))
        defaults = {"lr": 1e-3 if lr is None else lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
        defaults.update(given)
        torch.optim.Optimizer.__init__(self, params, defaults)
        self._init_extra(given, dict(loss_scaling=loss_scaling, max_weight_norm=max_weight_norm,
                                     bias_correction=bias_correction, accum_type=accum_type,
                                     first_order_momentum_accum_type=first_order_momentum_accum_type,
                                     second_order_momentum_accum_type=second_order_momentum_accum_type))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m, v = st["m"], st["v"]
                if self.bias_correction:
                    m, v = m / (1 - b1 ** st["step"]), v / (1 - b2 ** st["step"])
                u = m / (v.sqrt() + g["eps"]) + g["weight_decay"] * p
                r1, r2 = p.norm().clamp(max=self.max_weight_norm), u.norm()
                ratio = (r1 / r2) if r1 > 0 and r2 > 0 else torch.tensor(1.0)
                p.sub_(g["lr"] * ratio * u)
        return loss


def _dtype(t):
    return None if t is None else {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.half: "FLOAT16"}.get(t)


def to_popart(opt: torch.optim.Optimizer, weight_ids: dict) -> "popart.Optimizer":
    """The PopART optimizer doing ``opt``'s update (``weight_ids``: parameter -> PopART id).
    Group 0's values are the defaults; other groups' are inserted per weight. Raises
    :class:`Error` for an optimizer PopTorch cannot run (another class, ``amsgrad``,
    ``maximize``)."""
    groups = opt.param_groups
    variable = getattr(opt, "variable_attrs", {"lr"})
    extra = {k: getattr(opt, k, d) for k, d in getattr(opt, "_EXTRA", {}).items()}
    ls = float(extra.get("loss_scaling") or 1.0)
    clip = [popart.ClipNormSettings.clipAllWeights(float(extra["max_grad_norm"]))] \
        if extra.get("max_grad_norm") else []
    if any(g.get("maximize") for g in groups):
        raise Error("maximize=True is not supported by PopTorch's optimizers")

    def value(key, g, name=None):
        return (float(g[key]), (name or key) not in variable)

    if isinstance(opt, torch.optim.SGD):
        def values(g, prefix):
            return {f"{prefix}LearningRate": value("lr", g), f"{prefix}Momentum": value("momentum", g),
                    f"{prefix}Dampening": value("dampening", g), f"{prefix}WeightDecay": value("weight_decay", g),
                    f"{prefix}VelocityScaling": (float(extra.get("velocity_scaling") or 1.0), True)}
        vals = values(groups[0], "default")
        vals.update({"lossScaling": (ls, "loss_scaling" not in variable), "nesterov": (float(groups[0]["nesterov"]),
                                                                                        True)})
        mode = popart.SGDAccumulatorAndMomentum.Combined if extra.get("use_combined_accum") else \
            popart.SGDAccumulatorAndMomentum.Separate
        out = popart.SGD(vals, clip, accumulatorAndMomentum=mode, accumType=_dtype(extra.get("accum_type")),
                         accl1Type=_dtype(extra.get("velocity_accum_type")))
    elif isinstance(opt, (torch.optim.Adam, torch.optim.AdamW, LAMB)):
        if any(g.get("amsgrad") for g in groups):
            raise Error("Adam with amsgrad=True is not supported by PopTorch")
        lamb = isinstance(opt, LAMB)
        bias = extra.get("bias_correction", True)

        def values(g, prefix):
            b1, b2 = g["betas"]
            out_ = {f"{prefix}LearningRate": value("lr", g), f"{prefix}Beta1": (float(b1), "betas" not in variable),
                    f"{prefix}Beta2": (float(b2), "betas" not in variable), f"{prefix}Eps": value("eps", g),
                    f"{prefix}WeightDecay": value("weight_decay", g)}
            if lamb:
                out_[f"{prefix}MaxWeightNorm"] = (float(extra["max_weight_norm"]), True)
            return out_
        vals = values(groups[0], "default")
        vals["lossScaling"] = (ls, "loss_scaling" not in variable)
        if lamb:
            mode = popart.AdamMode.Lamb if bias else popart.AdamMode.LambNoBias
        else:
            mode = popart.AdamMode.Adam if bias else popart.AdamMode.AdamNoBias
        decay = popart.WeightDecayMode.Decay if isinstance(opt, (torch.optim.AdamW, LAMB)) else \
            popart.WeightDecayMode.L2Regularization
        out = popart.Adam(vals, mode, decay, accum_type=_dtype(extra.get("accum_type")),
                          accl1_type=_dtype(extra.get("first_order_momentum_accum_type")) or "FLOAT",
                          accl2_type=_dtype(extra.get("second_order_momentum_accum_type")) or "FLOAT",
                          clip_norm_settings=clip)
    elif isinstance(opt, torch.optim.RMSprop):
        def values(g, prefix):
            return {f"{prefix}LearningRate": value("lr", g), f"{prefix}Alpha": value("alpha", g),
                    f"{prefix}Eps": value("eps", g), f"{prefix}WeightDecay": value("weight_decay", g),
                    f"{prefix}Momentum": value("momentum", g)}
        vals = values(groups[0], "default")
        vals["lossScaling"] = (ls, "loss_scaling" not in variable)
        mode = popart.AdaptiveMode.CenteredRMSProp if groups[0]["centered"] else popart.AdaptiveMode.RMSProp
        out = popart.Adaptive(vals, mode, popart.WeightDecayMode.L2Regularization,
                              accum_type=_dtype(extra.get("accum_type")),
                              accl1_type=_dtype(extra.get("first_order_momentum_accum_type")) or "FLOAT",
                              accl2_type=_dtype(extra.get("second_order_momentum_accum_type")) or "FLOAT",
                              rmsprop_tf_variant=bool(extra.get("use_tf_variant")))
    else:
        raise Error(f"Unsupported optimizer {type(opt).__name__}: PopTorch runs SGD, Adam, AdamW, RMSprop and LAMB "
                    "(torch.optim or poptorch.optim)")
    for g in groups[1:]:
        # insertSpecific's keys: the defaults' names without "default" (``learningRate`` ...)
        spec = {k[0].lower() + k[1:]: v for k, v in values(g, "").items()}
        for p in g["params"]:
            if p in weight_ids:
                out.insertSpecific(weight_ids[p], spec)
    return out
