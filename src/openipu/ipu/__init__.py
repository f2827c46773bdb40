"""The simulated IPU hardware, as data: generations (:class:`Target`) and systems."""

from openipu.ipu.target import COMMON, FACTS, SYSTEMS, System, Target, fact, source, target

__all__ = ["COMMON", "FACTS", "SYSTEMS", "System", "Target", "fact", "source", "target"]
