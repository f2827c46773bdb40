"""``popart.CommGroup`` and ``popart.VariableSettings``: how a weight is shared between replicas
(PopART's replica-grouped variables, ``docs/popart/variablesettings.rst``).

``CommGroup(type=CommGroupType.All, replicaGroupSize=0)``; ``VariableSettings()``,
``VariableSettings(retrievalMode)``, ``VariableSettings(sharedVariableDomain: CommGroup,
retrievalMode=VariableRetrievalMode.OnePerGroup)``. ``getGroupCount(replicas)`` and
``numReplicasReturningVariable(replicas)`` follow PopART's definitions: ``All`` is one group,
``Ungrouped`` one per replica, ``Consecutive`` / ``Orthogonal`` groups of ``replicaGroupSize``
(``replicas / size`` groups, and ``size`` groups for ``Orthogonal``).

openipu keeps one value of each weight for all replicas: ``Builder.addInitializedInputTensor``
takes settings with a single group (``CommGroupType.All``, or a group of every replica) and
raises ``popart_exception`` for replica-grouped ones.
"""

from __future__ import annotations

from openipu.popart.errors import popart_exception
from openipu.popart.options import CommGroupType, VariableRetrievalMode


class CommGroup:
    """``popart.CommGroup(type=CommGroupType.All, replicaGroupSize=0)``."""

    def __init__(self, type=CommGroupType.All, replicaGroupSize: int = 0):  # noqa: A002,N803
        self.type = type
        self.replicaGroupSize = int(replicaGroupSize)

    def __eq__(self, other):
        return isinstance(other, CommGroup) and (self.type, self.replicaGroupSize) == (other.type,
                                                                                       other.replicaGroupSize)

    def __repr__(self):
        return f"CommGroup(type={self.type}, replicaGroupSize={self.replicaGroupSize})"


class VariableSettings:
    """``popart.VariableSettings([sharedVariableDomain], [retrievalMode])`` (module docstring)."""

    def __init__(self, *args, **kwargs):
        self.sharedVariableDomain = CommGroup()
        self.retrievalMode = VariableRetrievalMode.OnePerGroup
        for a in args:
            if isinstance(a, CommGroup):
                self.sharedVariableDomain = a
            else:
                self.retrievalMode = a
        if "sharedVariableDomain" in kwargs:
            self.sharedVariableDomain = kwargs["sharedVariableDomain"]
        if "retrievalMode" in kwargs:
            self.retrievalMode = kwargs["retrievalMode"]

    def getSharedVariableDomain(self) -> CommGroup:  # noqa: N802
        return self.sharedVariableDomain

    def getRetrievalMode(self):  # noqa: N802
        return self.retrievalMode

    def getGroupCount(self, replicaCount: int) -> int:  # noqa: N802,N803
        g = self.sharedVariableDomain
        if g.type == CommGroupType.All:
            return 1
        if g.type == CommGroupType.Ungrouped:
            return int(replicaCount)
        size = g.replicaGroupSize or int(replicaCount)
        if g.type == CommGroupType.Consecutive:
            return max(1, int(replicaCount) // size)
        return size             # Orthogonal: replicas r, r + size, ... form a group

    def numReplicasReturningVariable(self, replicaCount: int) -> int:  # noqa: N802,N803
        if self.retrievalMode == VariableRetrievalMode.AllReplicas:
            return int(replicaCount)
        return self.getGroupCount(replicaCount)

    def single_group(self) -> bool:
        """Whether every replica shares one value whatever the replication (openipu's case)."""
        g = self.sharedVariableDomain
        return g.type == CommGroupType.All or (g.type == CommGroupType.Consecutive and g.replicaGroupSize == 0)

    def check_supported(self, tid: str) -> None:
        if not self.single_group():
            raise popart_exception(f"Weight '{tid}': VariableSettings with {self.sharedVariableDomain} "
                                   "(replica-grouped variables) are not supported by openipu, which keeps one value "
                                   "of each weight for all replicas. Use CommGroup(CommGroupType.All)")

    def __repr__(self):
        return f"VariableSettings({self.sharedVariableDomain}, {self.retrievalMode})"
