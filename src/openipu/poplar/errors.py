"""Poplar's exception classes (``poplar::poplar_error`` and its subclasses).

The names mirror Poplar's C++ exceptions so code can ``except poplar.graph_connection_error``.
Each message says what is wrong and what to do.
"""

from __future__ import annotations


class poplar_error(RuntimeError):  # noqa: N801 - Poplar spelling
    """Base of every Poplar error. ``.type`` is the exception's Poplar name."""

    @property
    def type(self) -> str:
        return type(self).__name__


class graph_connection_error(poplar_error):  # noqa: N801
    """A vertex field connected to a tensor of the wrong type or size, or left unconnected."""


class graph_cycle_error(poplar_error):  # noqa: N801
    """A graph or program that cannot be ordered."""


class graph_memory_allocation_error(poplar_error):  # noqa: N801
    """The graph does not fit in tile memory (raised at compile time)."""

    def __init__(self, message, profile_path=None):
        super().__init__(message)
        self.profilePath = profile_path


class graph_object_creation_error(poplar_error):  # noqa: N801
    """A graph object could not be created (bad shape, bad type, bad arguments)."""


class graph_object_load_error(poplar_error):  # noqa: N801
    """Codelets could not be loaded."""


class index_error(poplar_error):  # noqa: N801
    """An index or slice outside a tensor's shape."""


class invalid_option(poplar_error):  # noqa: N801
    """An unknown option name or a bad option value."""


class invalid_tile_mapping(poplar_error):  # noqa: N801
    """A tensor or vertex that is not mapped to a tile, or mapped outside the target."""


class missing_cycle_estimate(poplar_error):  # noqa: N801
    """A vertex on an IPU Model with no cycle estimate (``setPerfEstimate`` / ``registerPerfEstimator``)."""


class no_environment(poplar_error):  # noqa: N801
    """No device could be found or attached."""


class parse_error(poplar_error):  # noqa: N801
    """Text (options JSON, codelet source) that cannot be parsed."""


class runtime_error(poplar_error):  # noqa: N801
    """An error while running an Engine (e.g. ``Abort``)."""


class application_runtime_error(runtime_error):  # noqa: N801
    """``Abort`` / ``AbortOnCondition`` fired while a program ran."""


class stream_connection_error(poplar_error):  # noqa: N801
    """A data stream used at run time with no host buffer or callback connected."""


class stream_memory_allocation_error(poplar_error):  # noqa: N801
    """A stream buffer too small for the data it must carry."""


class tensor_creation_error(poplar_error):  # noqa: N801
    """A tensor view that cannot be made (mismatched shapes or types)."""


class tensor_io_state_error(poplar_error):  # noqa: N801
    """A host read or write handle that does not exist or is used the wrong way."""


class unknown_field(poplar_error):  # noqa: N801
    """A vertex field name that the codelet does not declare."""


class unknown_vertex_type(poplar_error):  # noqa: N801
    """A vertex type with no codelet loaded (call ``graph.addCodelets`` first)."""


class control_program_error(poplar_error):  # noqa: N801
    """A malformed program (e.g. a non-scalar predicate)."""
