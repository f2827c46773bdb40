"""``popart.CommGroup`` and ``popart.VariableSettings``: how a weight is shared between replicas
(PopART's replica-grouped variables, ``docs/popart/variablesettings.rst``).

``CommGroup(type=CommGroupType.All, replicaGroupSize=0)``; ``VariableSettings()``,
``VariableSettings(retrievalMode)``, ``VariableSettings(sharedVariableDomain: CommGroup,
retrievalMode=VariableRetrievalMode.OnePerGroup)``, ``VariableSettings(stride, groupSize, mode)``.

The groups over ``R`` replicas (PopART's definitions):

- ``All``: one group of every replica (the size is ignored);
- ``Consecutive`` of size ``k``: ``R / k`` groups of ``k`` neighbours, ``{0..k-1}, {k..2k-1}, ...``;
- ``Orthogonal`` of size ``k``: ``R / k`` groups of ``k`` replicas ``R / k`` apart
  (``{0, R/k, ...}, {1, R/k + 1, ...}``);
- ``Ungrouped`` (C++ ``CommGroupType::None``): one group per replica.

A grouped weight is given to ``Builder.addInitializedInputTensor`` with one value per group,
shape ``[groups, *shape]`` (no leading dimension when there is one group); each replica holds
``shape``. ``weightsToHost`` / ``readWeights`` return ``numReplicasReturningVariable(R)`` values:
one per group (``OnePerGroup``; ``AllReduceReplicas``, which PopART documents as unsupported and
treats like it), or one per replica (``AllReplicas``). Training reduces a grouped weight's
gradient within its groups only (:func:`collective_attrs`).

Errors: a ``Consecutive`` / ``Orthogonal`` group of size < 1 raises
``popart_internal_exception`` ("VariableSettings had 1 errors!") when the settings are made;
a group size that does not divide the replication factor, or a leading dimension that is not the
group count, raises ``popart_exception`` when the session is made (:func:`check_grouping`).
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_exception, popart_internal_exception
from openipu.popart.options import CommGroupType, VariableRetrievalMode

#: ONNX ``metadata_props`` keys of a weight's settings (PopART's ``sCommGroupType`` ... + "/" + id)
META_TYPE, META_SIZE, META_MODE = "__comm_group_type", "__comm_group_size", "__variable_settings"
_TYPES = ("All", "Consecutive", "Orthogonal", "Ungrouped")      # C++ values 0..3
_MODES = ("OnePerGroup", "AllReduceReplicas", "AllReplicas")    # C++ values 0..2


def _type_name(t) -> str:
    return CommGroupType.member(t)


def _mode_name(m) -> str:
    return VariableRetrievalMode.member(m)


class CommGroup:
    """``popart.CommGroup(type=CommGroupType.All, replicaGroupSize=0)``: a group type and the
    number of replicas in each group."""

    def __init__(self, type=CommGroupType.All, replicaGroupSize: int = 0):  # noqa: A002,N803
        self.type = getattr(CommGroupType, _type_name(type))
        self.replicaGroupSize = int(replicaGroupSize)

    def __eq__(self, other):
        return isinstance(other, CommGroup) and (self.type, self.replicaGroupSize) == (other.type,
                                                                                       other.replicaGroupSize)

    def __hash__(self):
        return hash((str(self.type), self.replicaGroupSize))

    def __repr__(self):
        name = "None" if str(self.type) == "Ungrouped" else str(self.type)
        return f"CommGroup(type={name}, replicaGroupSize={self.replicaGroupSize})"


class VariableSettings:
    """``popart.VariableSettings([sharedVariableDomain], [retrievalMode])`` or
    ``VariableSettings(stride, groupSize, mode)`` (module docstring).

    Raises ``popart_internal_exception`` for a Consecutive / Orthogonal group of size < 1 and
    for an unknown retrieval mode (PopART's ``verify``)."""

    def __init__(self, *args, **kwargs):
        self._stride = None          # set when made from (stride, groupSize, mode)
        self.sharedVariableDomain = CommGroup()
        self.retrievalMode = VariableRetrievalMode.OnePerGroup
        ints = [a for a in args if isinstance(a, (int, np.integer)) and not isinstance(a, bool)
                and not hasattr(a, "_value")]
        if len(ints) >= 2:                       # (stride, groupSize[, mode])
            self._stride, size = int(ints[0]), int(ints[1])
            if self._stride == 0 or size == 0:
                raise popart_exception("The stride and the group size in a `popart::VariableSettings` must be "
                                       "positive integers.")
            if size == 1:
                self._stride = 1
            self.sharedVariableDomain = CommGroup(CommGroupType.Consecutive, size)
            args = args[2:]
        for a in args:
            if isinstance(a, CommGroup):
                self.sharedVariableDomain = a
            else:
                self.retrievalMode = getattr(VariableRetrievalMode, _mode_name(a))
        for k in ("sharedVariableDomain", "sharedVariableDomain_"):
            if k in kwargs:
                self.sharedVariableDomain = kwargs[k]
        for k in ("retrievalMode", "retrievalMode_", "mode"):
            if k in kwargs:
                self.retrievalMode = getattr(VariableRetrievalMode, _mode_name(kwargs[k]))
        self.verify()

    # -- PopART's API ---------------------------------------------------------------------
    def verify(self) -> None:  # noqa: D102
        g = self.sharedVariableDomain
        if str(g.type) in ("Consecutive", "Orthogonal") and g.replicaGroupSize < 1:
            raise popart_internal_exception("VariableSettings had 1 errors!")

    def getSharedVariableDomain(self) -> CommGroup:  # noqa: N802
        return self.sharedVariableDomain

    def getRetrievalMode(self):  # noqa: N802
        return self.retrievalMode

    def isUsingCommGroup(self) -> bool:  # noqa: N802
        return self._stride is None

    def getCommGroupType(self):  # noqa: N802
        return self.sharedVariableDomain.type

    def getGroupSize(self) -> int:  # noqa: N802
        return self.sharedVariableDomain.replicaGroupSize

    def _kind(self) -> str:
        g = self.sharedVariableDomain
        if str(g.type) == "Ungrouped" or (str(g.type) != "All" and g.replicaGroupSize == 1):
            return "Ungrouped"
        return str(g.type)

    def getGroupCount(self, replicaCount: int) -> int:  # noqa: N802,N803
        """Groups over ``replicaCount`` replicas (1 for All, R for Ungrouped, R / size else)."""
        r = int(replicaCount)
        kind = self._kind()
        if kind == "All":
            return 1
        if kind == "Ungrouped":
            return r
        return max(1, r // self.getGroupSize())

    def numReplicasReturningVariable(self, replicaCount: int) -> int:  # noqa: N802,N803
        """Values ``weightsToHost`` returns: R for ``AllReplicas`` (and Ungrouped), else the
        group count."""
        if str(self.retrievalMode) == "AllReplicas":
            return int(replicaCount)
        return self.getGroupCount(replicaCount)

    def getStride(self, replicaCount: int | None = None) -> int:  # noqa: N802,N803
        """Distance between the replicas of a group: ``R / size`` for Orthogonal, else 1."""
        if self._stride is not None:
            return self._stride
        if self._kind() == "Orthogonal":
            if replicaCount is None:
                raise popart_exception("getStride of an Orthogonal CommGroup needs the replica count")
            return int(replicaCount) // self.getGroupSize()
        return 1

    def getRealGroupSize(self, replicaCount: int) -> int:  # noqa: N802,N803
        kind = self._kind()
        return int(replicaCount) if kind == "All" else 1 if kind == "Ungrouped" else self.getGroupSize()

    def getGroupRepresentative(self, group: int) -> int:  # noqa: N802
        """The first replica of ``group``."""
        kind = self._kind()
        if kind == "All":
            return 0
        if kind == "Consecutive" and self._stride in (None, 1):
            return self.getGroupSize() * int(group)
        if self._stride is not None and self._stride > 1:
            s, k = self._stride, self.getGroupSize()
            return (int(group) // s) * (s * k) + int(group) % s
        return int(group)

    def groups(self, replicaCount: int) -> list[list[int]]:
        """The replicas of each group, in order."""
        r = int(replicaCount)
        kind = self._kind()
        if kind == "All":
            return [list(range(r))]
        if kind == "Ungrouped":
            return [[i] for i in range(r)]
        k = self.getGroupSize()
        stride = self.getStride(r)
        return [[self.getGroupRepresentative(g) + i * stride for i in range(k)] for g in range(r // k)]

    def shapeOnReplica(self, full_shape, replicaCount: int, name: str = "") -> list[int]:  # noqa: N802,N803
        """The per-replica shape of a host value ``full_shape`` (its leading group dimension
        dropped when there are several groups). Raises ``popart_exception`` when that dimension
        is not the group count."""
        full_shape = list(full_shape)
        n = self.getGroupCount(replicaCount)
        if n == 1:
            return full_shape
        if not full_shape or full_shape[0] != n:
            raise popart_exception(f"Incorrect size of tensor {name}. Tensor shape at index 0 "
                                   f"({full_shape[0] if full_shape else 'none'}) should be == group_size = {n}")
        return full_shape[1:]

    def shapeOnHost(self, replicaShape, replicaCount: int) -> list[int]:  # noqa: N802,N803
        n = self.getGroupCount(replicaCount)
        return list(replicaShape) if n == 1 else [n, *replicaShape]

    # -- openipu ----------------------------------------------------------------------------
    def group_of(self, replicaCount: int) -> list[int]:
        """The group of each replica."""
        out = [0] * int(replicaCount)
        for g, members in enumerate(self.groups(replicaCount)):
            for r in members:
                out[r] = g
        return out

    def single_group(self) -> bool:
        """Whether every replica shares one value whatever the replication."""
        return self._kind() == "All"

    def __eq__(self, other):
        return isinstance(other, VariableSettings) and (self.sharedVariableDomain, str(self.retrievalMode),
                                                        self._stride) == (other.sharedVariableDomain,
                                                                          str(other.retrievalMode), other._stride)

    def __hash__(self):
        return hash((self.sharedVariableDomain, str(self.retrievalMode), self._stride))

    def __repr__(self):
        t = "None" if str(self.sharedVariableDomain.type) == "Ungrouped" else str(self.sharedVariableDomain.type)
        return (f"VariableSettings(commGroupType={t}, groupSize={self.getGroupSize()}, "
                f"retrievalMode={self.retrievalMode})")


def check_grouping(vs: VariableSettings, replicas: int, tid: str) -> None:
    """Raise ``popart_exception`` when the groups of ``vs`` do not divide ``replicas`` evenly."""
    kind = vs._kind()
    if kind in ("All", "Ungrouped"):
        return
    k, s = vs.getGroupSize(), (vs._stride or 1)
    if k > replicas or replicas % (k * s):
        raise popart_exception(
            f"Weight '{tid}': {vs.sharedVariableDomain} over {replicas} replicas: the number of replicas in a "
            "`popart::ReplicaGrouping` must be divisible by the product of the stride and the group size.")


def to_metadata(vs: VariableSettings, tid: str) -> list[tuple[str, str]]:
    """The ONNX ``metadata_props`` PopART's Builder writes for a weight's settings."""
    return [(f"{META_TYPE}/{tid}", str(_TYPES.index(str(vs.sharedVariableDomain.type)))),
            (f"{META_SIZE}/{tid}", str(vs.sharedVariableDomain.replicaGroupSize)),
            (f"{META_MODE}/{tid}", str(_MODES.index(str(vs.retrievalMode))))]


def from_metadata(model) -> dict[str, VariableSettings]:
    """Weight id -> settings, from a model's ``metadata_props`` (weights with the default
    settings, one group, are left out). Raises ``popart_exception`` for unreadable values."""
    props = {p.key: p.value for p in model.metadata_props}
    out = {}
    for key, value in props.items():
        if not key.startswith(META_TYPE + "/"):
            continue
        tid = key[len(META_TYPE) + 1:]
        try:
            t = int(value)
            size = int(props.get(f"{META_SIZE}/{tid}", "0"))
            mode = int(props.get(f"{META_MODE}/{tid}", "0"))
            vs = VariableSettings(CommGroup(getattr(CommGroupType, _TYPES[t]), size),
                                  getattr(VariableRetrievalMode, _MODES[mode]))
        except (ValueError, IndexError):
            raise popart_exception(f"Unreadable variable settings of weight '{tid}' in the model's "
                                   "metadata_props") from None
        if not (vs.single_group() and str(vs.retrievalMode) == "OnePerGroup"):
            out[tid] = vs
    return out


def collective_attrs(vs: VariableSettings | None) -> dict:
    """A collective's ``commGroup`` attribute (``[type, size]``, PopART's ``__collectiveCommGroup``)
    for the gradient reduction of a weight with settings ``vs`` ({} for all replicas)."""
    if vs is None or vs.single_group():
        return {}
    kind = vs._kind()
    if kind == "Ungrouped":
        return {"commGroup": [_TYPES.index("Consecutive"), 1]}
    return {"commGroup": [_TYPES.index(kind), vs.getGroupSize()]}


def comm_groups(attr, replicas: int) -> list[list[int]]:
    """The replica groups of a collective's ``commGroup`` attribute (None: one group of all)."""
    if not attr:
        return [list(range(replicas))]
    t, size = int(attr[0]), int(attr[1])
    name = _TYPES[t] if 0 <= t < len(_TYPES) else None
    if name is None:
        raise popart_exception("Unknown commGroup type for collective op")
    if name == "All" or (name != "Ungrouped" and size == 0):
        return [list(range(replicas))]
    if size > replicas or (name != "Ungrouped" and replicas % size):
        raise popart_exception(f"Replica group size in commGroup ({size}) does not divide the {replicas} replicas")
    vs = VariableSettings(CommGroup(getattr(CommGroupType, name), size))
    return vs.groups(replicas)


def comm_size(attr, replicas: int) -> int:
    """The number of replicas in each group of a collective's ``commGroup`` attribute (PopART's
    ``CollectivesBaseOp::getCommSize``): ``replicas`` for All (or no attribute), the group size
    for Consecutive / Orthogonal, 1 for None. Raises ``popart_exception`` as
    :func:`comm_groups`."""
    return len(comm_groups(attr, replicas)[0])


def group_position(attr, replicas: int) -> tuple[list[int], list[int]]:
    """``(group, position)`` of each of ``replicas`` replicas in the groups of a collective's
    ``commGroup`` attribute: the index of its group and its place in it (the piece of a
    reduce-scatter it receives)."""
    group, pos = [0] * replicas, [0] * replicas
    for g, members in enumerate(comm_groups(attr, replicas)):
        for q, r in enumerate(members):
            group[r], pos[r] = g, q
    return group, pos


def replica_grouping(group, replicas: int) -> tuple[int, int, int]:
    """``(numReplicas, stride, groupSize)`` of a :class:`CommGroup` (None: All) over ``replicas``
    (PopART's ``CommGroup::toReplicaGrouping``; a group of one has stride 1)."""
    kind = "All" if group is None else _type_name(group.type)
    size = 0 if group is None else int(group.replicaGroupSize)
    if kind == "All" or (kind in ("Consecutive", "Orthogonal") and size == 0):
        return (replicas, 1, replicas)
    if kind == "Ungrouped" or size == 1:
        return (replicas, 1, 1)
    return (replicas, 1 if kind == "Consecutive" else replicas // size, size)
