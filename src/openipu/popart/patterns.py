"""``popart.Patterns``: PopART's graph-rewrite pattern settings, by name.

The names, whether each is on by default and whether it is mandatory are those of PopART's
``PatternCreator`` registrations (SDK 3.4). ``Patterns()`` is ``PatternsLevel.Default`` (the
default-on set plus ``InPlace``), ``Patterns(PatternsLevel.All)`` all of them, ``Minimal`` the
mandatory ones (no ``InPlace``), ``NoPatterns`` none; ``Patterns([names])`` exactly the names
listed (``InPlace`` and ``UpdateInplacePrioritiesForIpu`` included when listed). An unknown name
raises ``popart_exception("Unknown pattern X")`` (``", did you mean InPlace?"`` for
``Inplace``); disabling a mandatory pattern raises "Pattern 'X' is mandatory and cannot be
disabled"; a session made with runtime asserts on (the default) and a mandatory pattern off
raises "Pattern 'X' must be enabled" (:meth:`Patterns.check_mandatory`).

openipu's IR does not rewrite by patterns; the settings it reads: ``InPlace`` (in-place
lowerings) and ``NlllWithSoftmaxGradDirect`` (the fused softmax + NLL gradient, see
:mod:`openipu.popart.transforms.autodiff`).
"""

from __future__ import annotations

from openipu.popart.errors import popart_exception
from openipu.popart.options import PatternsLevel

#: name -> (enabled by default, mandatory)
PATTERNS = {
    "AbsGradOp": (True, True), "AllReduceToIdentity": (True, True), "Atan2Arg0GradOp": (True, True),
    "Atan2Arg1GradOp": (True, True), "ConvDataGrad": (True, True), "ConvFlipWeightsDoubleFlip": (True, False),
    "ConvFlipWeightsGradOp": (True, True), "ConvTranspose": (True, True), "CosGradOp": (True, True),
    "CoshOp": (True, True), "DecomposeBinaryConstScalar": (True, False), "DivArg0GradOp": (True, True),
    "DivArg1GradOp": (True, True), "ExpandCast": (True, False), "ExpGradOp": (True, True),
    "Expm1GradOp": (True, True), "FmodArg0GradOp": (True, True), "InitAccumulate": (True, False),
    "LambSerialisedWeight": (True, False), "Log1pGradOp": (True, True), "LogGradOp": (True, True),
    "LoopScanOut": (True, True), "LSTMOp": (False, False), "MatMulOp": (True, True),
    "MatMulLhsGradOp": (True, True), "MatMulRhsGradOp": (True, True), "MulArgGradOp": (True, True),
    "NegativeOneScale": (True, False), "NlllWithSoftmaxGradDirect": (True, False), "OpToIdentity": (True, False),
    "PackedDataBlock": (True, False), "PadSum": (True, False), "PostNRepl": (True, False),
    "PowArg0GradOp": (True, True), "PowArg1GradOp": (True, True), "PreUniRepl": (True, False),
    "RandomNormalLikeOpPattern": (True, True), "RandomUniformLikeOpPattern": (True, True),
    "ReciprocalGradOp": (True, True), "RemoveUnnecessaryLossGradCast": (True, False), "ScanToLoop": (True, True),
    "SinGradOp": (True, True), "Slice2SliceSubsample": (False, False), "SoftmaxGradDirect": (True, False),
    "SplitGather": (False, False), "SplitGradOpToConcat": (True, False), "SplitOp": (True, False),
    "SqrtGradOp": (True, True), "SubtractArg1GradOp": (True, True), "SumToAdd": (True, False),
    "TiedGather": (False, False), "TiedGatherAccumulate": (False, False),
    "TransposeToIdentityOrReshapePattern": (True, False), "UpsampleToResize": (True, False),
    "ZerosLikeOpPattern": (True, True),
}
#: the two patterns PopART handles apart from the pre-alias ones
_SPECIAL = ("InPlace", "UpdateInplacePrioritiesForIpu")
#: the Python properties PopART binds (note ``SoftMax`` in the property names)
_PROPERTIES = {"PreUniRepl": "PreUniRepl", "PostNRepl": "PostNRepl", "SoftMaxGradDirect": "SoftmaxGradDirect",
               "NlllWithSoftMaxGradDirect": "NlllWithSoftmaxGradDirect", "OpToIdentity": "OpToIdentity",
               "SubtractArg1GradOp": "SubtractArg1GradOp", "MulArgGradOp": "MulArgGradOp", "MatMulOp": "MatMulOp",
               "MatMulLhsGradOp": "MatMulLhsGradOp", "MatMulRhsGradOp": "MatMulRhsGradOp"}


def _unknown(name: str):
    if name == "Inplace":
        return popart_exception(f"Unknown pattern {name}, did you mean InPlace?")
    return popart_exception(f"Unknown pattern {name}")


class Patterns:
    """``popart.Patterns()`` / ``Patterns(PatternsLevel.X)`` / ``Patterns([names])`` (module
    docstring). Raises ``popart_exception`` for unknown names."""

    def __init__(self, level_or_names=PatternsLevel.Default):
        self._runtime_asserts = True
        self._settings: dict[str, bool] = {}
        self._special = {"InPlace": False, "UpdateInplacePrioritiesForIpu": False}
        if isinstance(level_or_names, (list, tuple)):
            self.level = None
            for n in level_or_names:
                if n in _SPECIAL:
                    self._special[n] = True
                elif n in PATTERNS:
                    self._settings[n] = True
                else:
                    raise _unknown(n)
            return
        self.level = level_or_names
        for n, (default, mandatory) in PATTERNS.items():
            if level_or_names == PatternsLevel.Default:
                self._settings[n] = default
            elif level_or_names == PatternsLevel.All:
                self._settings[n] = True
            elif level_or_names == PatternsLevel.Minimal:
                self._settings[n] = mandatory
        on = level_or_names in (PatternsLevel.Default, PatternsLevel.All)
        self._special = {"InPlace": on, "UpdateInplacePrioritiesForIpu": on}

    @classmethod
    def create(cls, names) -> "Patterns":
        return cls(list(names))

    # -- by name ----------------------------------------------------------------------------
    def isPatternEnabled(self, name: str) -> bool:  # noqa: N802
        if name in _SPECIAL:
            return self._special[name]
        if name not in PATTERNS:
            raise _unknown(name)
        return self._settings.get(name, False)

    def enablePattern(self, name: str, enable: bool) -> "Patterns":  # noqa: N802
        if name in _SPECIAL:
            self._special[name] = bool(enable)
            return self
        if name not in PATTERNS:
            raise _unknown(name)
        if not enable and PATTERNS[name][1]:
            raise popart_exception(f"Pattern '{name}' is mandatory and cannot be disabled")
        self._settings[name] = bool(enable)
        return self

    def enableRuntimeAsserts(self, enable: bool) -> "Patterns":  # noqa: N802
        self._runtime_asserts = bool(enable)
        return self

    def check_mandatory(self) -> None:
        """PopART's ``ensureAllMandatoryPreAliasPatternsAreEnabled`` (at session creation, with
        runtime asserts on). Raises ``popart_exception`` naming the first one off."""
        if not self._runtime_asserts:
            return
        for n, (_, mandatory) in PATTERNS.items():
            if mandatory and not self._settings.get(n, False):
                raise popart_exception(f"Pattern '{n}' must be enabled")

    @staticmethod
    def isMandatory(name: str) -> bool:  # noqa: N802
        return PATTERNS.get(name, (False, False))[1]

    @staticmethod
    def getAllPreAliasPatternNames() -> list[str]:  # noqa: N802
        return sorted(PATTERNS)

    # -- the bound properties -------------------------------------------------------------
    @property
    def InPlace(self) -> bool:  # noqa: N802
        return self._special["InPlace"]

    @InPlace.setter
    def InPlace(self, value: bool) -> None:  # noqa: N802
        self._special["InPlace"] = bool(value)

    @property
    def UpdateInplacePrioritiesForIpu(self) -> bool:  # noqa: N802
        return self._special["UpdateInplacePrioritiesForIpu"]

    @UpdateInplacePrioritiesForIpu.setter
    def UpdateInplacePrioritiesForIpu(self, value: bool) -> None:  # noqa: N802
        self._special["UpdateInplacePrioritiesForIpu"] = bool(value)

    def __repr__(self):
        on = [n for n in sorted(PATTERNS) if self._settings.get(n)] + [n for n in _SPECIAL if self._special[n]]
        return f"Patterns({', '.join(on)})"


def _make_property(prop: str, name: str):
    def get(self) -> bool:
        return self._settings.get(name, False)

    def set_(self, value: bool) -> None:
        self.enablePattern(name, value)
    return property(get, set_, doc=f"Whether PopART's ``{name}`` pattern is on.")


for _prop, _name in _PROPERTIES.items():
    setattr(Patterns, _prop, _make_property(_prop, _name))
