"""``poplar::QuarterMetadata`` and the metadata tensors of fp8 (``QUARTER``) tensors.

A QUARTER element is one byte in one of two fp8 formats, named by the tensor's metadata:
``F143`` (1 sign, 4 exponent, 3 mantissa bits) and ``F152`` (1, 5, 2). The metadata also holds a
*scale bias* ``s``, an integer in ``[-32, 31]``: the value of an element is
``decode_format(byte) * 2**s``. So a cast of ``x`` to QUARTER with scale ``s`` stores
``fp8(x * 2**-s)``, a cast back multiplies by ``2**s``, and a matrix product on QUARTER operands
computes with the operands' values: the AMP applies both scales as it accumulates.

The metadata of a tensor lives in a *metadata tensor* (type ``QUARTER_METADATA``, one byte on a
tile) so that a program can set the scale at run time (``createVariableMetadataTensor(graph,
format, scaleTensor, prog)``). openipu's byte encoding: bits 0..5 the scale bias (two's
complement), bit 6 the format (1 = F143, 0 = F152).

Simulation [A]: the elements are stored in torch's fp8 types, ``float8_e4m3fn`` for F143 and
``float8_e5m2`` for F152 (max 448 / 57344), a real fp8 round trip per cast. The IPU's own formats
differ at the edges (PopLibs' tests give their ranges without scaling as [2^-10, 2^7] for F143
and [2^-17, 2^15] for F152, exponent biases 8 and 16, as torch's ``float8_e4m3fnuz`` /
``float8_e5m2fnuz``): E5M2 values agree with those from 2^-14 up; F143's largest values are
240 on the IPU, 448 here. The element format is fixed when the tensor is created (the metadata
tensor's format); only the scale is read at run time.

Sources: Poplar's ``poplar/Quarter.hpp`` / ``MetadataCreation.hpp`` API as PopART and PopLibs call
it (``createVariableMetadataTensor``, ``popops::cast(graph, t, QUARTER, metadata, prog)``,
``graph.clone(QUARTER, metadata, t)``, ``Tensor::getMetadata``).
"""

from __future__ import annotations

import enum

import torch

from openipu.poplar import errors
from openipu.poplar.types import QUARTER, QUARTER_F152, QUARTER_METADATA, Type
from openipu.poplar.graph_codec import kernel

#: the scale bias range of ``QuarterMetadata`` (PopLibs' QUARTER_METADATA_SCALE_BIAS_MIN / MAX)
SCALE_BIAS_MIN, SCALE_BIAS_MAX = -32, 31
_FORMAT_BIT = 0x40


class QuarterMetadata:
    """``poplar::QuarterMetadata(format=F143, scale=0)``: an fp8 format and a scale bias.

    Args:
        format: ``QuarterMetadata.Format.F143`` or ``.F152`` (or the strings ``"F143"`` / ``"F152"``).
        scale: int in ``[-32, 31]``; an element's value is its fp8 value times ``2**scale``.

    Raises:
        poplar_error: scale out of range; an unknown format.
    """

    class Format(enum.Enum):
        F143 = "F143"
        F152 = "F152"

    __slots__ = ("_format", "_scale")

    def __init__(self, format=None, scale: int = 0):  # noqa: A002 - Poplar's parameter name
        self._format = as_format(format if format is not None else QuarterMetadata.Format.F143)
        scale = int(scale)
        if not SCALE_BIAS_MIN <= scale <= SCALE_BIAS_MAX:
            raise errors.poplar_error(f"QuarterMetadata: scale bias {scale} is outside [{SCALE_BIAS_MIN}, "
                                      f"{SCALE_BIAS_MAX}]")
        self._scale = scale

    def getFormat(self) -> "QuarterMetadata.Format":  # noqa: N802
        return self._format

    def getScale(self) -> int:  # noqa: N802
        return self._scale

    def __eq__(self, other):
        return isinstance(other, QuarterMetadata) and (self._format, self._scale) == (other._format, other._scale)

    def __hash__(self):
        return hash((self._format, self._scale))

    def __repr__(self):
        return f"{self._format.name}, scale: {self._scale}"

    def toString(self) -> str:  # noqa: N802
        return repr(self)

    def __reduce__(self):
        return (QuarterMetadata, (self._format.value, self._scale))

    def encode(self) -> int:
        """The metadata byte (openipu's encoding, see the module docstring)."""
        return encode(self._format, self._scale)


def as_format(f) -> QuarterMetadata.Format:
    """``QuarterMetadata.Format`` from a Format or its name (``"F143"`` / ``"F152"``).

    Raises:
        poplar_error: another value.
    """
    if isinstance(f, QuarterMetadata.Format):
        return f
    try:
        return QuarterMetadata.Format(f.decode() if isinstance(f, bytes) else str(f))
    except ValueError:
        raise errors.poplar_error(f"QuarterMetadata: unknown format {f!r} (use F143 or F152)") from None


def encode(fmt, scale: int) -> int:
    """The metadata byte of ``(format, scale)``: bit 6 the format, bits 0..5 the scale."""
    return (_FORMAT_BIT if as_format(fmt) == QuarterMetadata.Format.F143 else 0) | (int(scale) & 0x3F)


def decode_scale(byte: torch.Tensor) -> torch.Tensor:
    """The scale biases (int64) of metadata bytes (any shape)."""
    s = byte.to(torch.int64) & 0x3F
    return torch.where(s >= 32, s - 64, s)


def storage_type(fmt) -> Type:
    """The QUARTER storage variant holding ``fmt``'s elements (:data:`~openipu.poplar.types.QUARTER`
    for F143, :data:`~openipu.poplar.types.QUARTER_F152` for F152); both are Poplar's QUARTER."""
    return QUARTER if as_format(fmt) == QuarterMetadata.Format.F143 else QUARTER_F152


def format_of_type(t: Type) -> QuarterMetadata.Format:
    """The fp8 format a QUARTER storage variant holds."""
    return QuarterMetadata.Format.F152 if t.space == QUARTER_F152.space else QuarterMetadata.Format.F143


def createVariableMetadataTensor(graph, format, scale=0, prog=None, debugContext: str = ""):  # noqa: N802,A002
    """``poplar::createVariableMetadataTensor``: a ``QUARTER_METADATA`` tensor (shape ``[1]``, one
    byte on tile 0) holding ``format`` and a scale bias.

    Forms: ``(graph, format, scale: int)``: the byte is the tensor's initial value (a variable, so
    programs may change it); ``(graph, format, scaleTensor, prog[, debugContext])``: ``prog``
    computes the byte from the INT scalar ``scaleTensor`` at run time (one single-tile vertex;
    scales outside ``[-32, 31]`` wrap to 6 bits).

    Raises:
        poplar_error: unknown format, scale out of range. graph_connection_error: a scale tensor
        that is not a scalar integer, or no ``prog`` for it.
    """
    from openipu.poplar.tensor import Tensor
    fmt = as_format(format)
    if isinstance(scale, Tensor):
        if prog is None or not hasattr(prog, "add"):
            raise errors.graph_connection_error("createVariableMetadataTensor: a scale tensor needs a program "
                                                "to compute the metadata in")
        if scale.numElements() != 1 or scale.elementType().is_float:
            raise errors.graph_connection_error(
                f"createVariableMetadataTensor: the scale must be an integer scalar, got {scale.elementType()} "
                f"of shape {scale.shape()}")
        md = _metadata_variable(graph, fmt, debugContext)
        _add_metadata_compute(graph, fmt, scale.reshape([1]), md, prog, debugContext)
        return md
    value = QuarterMetadata(fmt, scale).encode()
    md = _metadata_variable(graph, fmt, debugContext)
    graph.setInitialValue(md, value)
    return md


def _metadata_variable(graph, fmt, name):
    md = graph.addVariable(QUARTER_METADATA, [1], name or "quarterMetadata")
    graph.setTileMapping(md, 0)
    graph._state.variables[int(md.pieces.var[0])].quarter_format = fmt.value
    return md


def createConstantMetadataTensor(graph, format, scale: int = 0, debugContext: str = ""):  # noqa: N802,A002
    """``poplar::createConstantMetadataTensor``: a constant ``QUARTER_METADATA`` tensor ``[1]`` on tile 0.

    Raises:
        poplar_error: unknown format, scale out of range.
    """
    m = QuarterMetadata(format, scale)
    md = graph.addConstant(QUARTER_METADATA, [1], m.encode(), debugContext or "quarterMetadata")
    graph.setTileMapping(md, 0)
    graph._state.variables[int(md.pieces.var[0])].quarter_format = m.getFormat().value
    return md


#: the largest finite value of each format's storage dtype (saturation)
MAX = {QuarterMetadata.Format.F143: 448.0, QuarterMetadata.Format.F152: 57344.0}


def quantize_values(x: torch.Tensor, fmt, scale: int | torch.Tensor = 0) -> torch.Tensor:
    """``fp8_fmt(x * 2**scale)`` in the storage dtype of ``fmt`` (``float8_e4m3fn`` /
    ``float8_e5m2``): scaled, saturated at the format's largest value, rounded to nearest even
    (a real torch fp8 round trip). NaN stays NaN. ``scale``: an int or a per-replica int tensor
    (``x``'s leading dim)."""
    fmt = as_format(fmt)
    y = x.float()
    if isinstance(scale, torch.Tensor):
        y = scale_by(y, scale)
    elif scale:
        y = y * (2.0 ** int(scale))
    y = torch.clamp(y, -MAX[fmt], MAX[fmt])
    return y.to(storage_type(fmt).torch_dtype)


def metadata_initial_scale(graph, md) -> int:
    """The scale bias a metadata tensor is created with (0 when a program computes it)."""
    b = graph.metadata_byte(md)
    return 0 if b is None else int(decode_scale(torch.tensor(b)))


@kernel
def _metadata_kernel(scale, md, fmt_bit, ctx):
    s = ctx.read(scale).to(torch.int64)
    ctx.write(md, (s & 0x3F) | fmt_bit)


def _add_metadata_compute(graph, fmt, scale, md, prog, name):
    import functools

    import numpy as np

    from openipu.poplar.graph import Access, VertexGroup
    from openipu.poplar.program import Execute
    cs = graph.addComputeSet(f"{name or 'quarterMetadata'}/create")
    fmt_bit = _FORMAT_BIT if fmt == QuarterMetadata.Format.F143 else 0
    # [A] one worker: load the scale, mask, or in the format, store a byte (~ a scalar map's 20 cycles)
    graph.add_vertex_group(cs, VertexGroup(
        "poplar::CreateQuarterMetadata", np.zeros(1, np.int64), np.full(1, 20, np.int64),
        functools.partial(_metadata_kernel, scale, md, fmt_bit),
        reads=[Access(scale)], writes=[Access(md)], multi=False, flops=0.0))
    prog.add(Execute(cs))


def check_metadata_tensor(md, what: str) -> None:
    """Raise ``graph_connection_error`` unless ``md`` is a one-element QUARTER_METADATA tensor."""
    if md.elementType() != QUARTER_METADATA or md.numElements() != 1:
        raise errors.graph_connection_error(
            f"{what}: the metadata must be a QUARTER_METADATA tensor of one element, got {md.elementType()} "
            f"of shape {md.shape()}")


def metadata_access(md, tiles):
    """The read of metadata tensor ``md`` by the vertices on global ``tiles``: its byte is
    multicast to each of them (they load it into their fp8 configuration); one byte received per
    tile, the send counted once (``count_send`` False: a broadcast) [A]."""
    import numpy as np

    from openipu.poplar.exchange import Boxes
    from openipu.poplar.graph import Access
    tiles = np.unique(np.asarray(tiles, np.int64))
    n = int(tiles.size)
    return Access(md.reshape([1]), Boxes(np.zeros((n, 1), np.int64), np.ones((n, 1), np.int64), tiles),
                  count_send=False)


def metadata_scale(ctx, md) -> torch.Tensor | None:
    """At run time: the scale bias of metadata tensor ``md`` per replica (int64 ``[replicas]``),
    or None when ``md`` is None (no metadata: scale 0)."""
    if md is None:
        return None
    return decode_scale(ctx.read(md).reshape(ctx.replicas, -1)[:, 0])


def scale_by(v: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``v * 2**scale`` (per replica: ``v``'s leading dim is the replicas) in ``v``'s float dtype."""
    if scale is None or not bool((scale != 0).any()):
        return v
    f = torch.pow(2.0, scale.to(torch.float32)).to(v.dtype if v.is_floating_point() else torch.float32)
    return v * f.reshape((-1,) + (1,) * (v.dim() - 1))
