"""Small helpers shared by the precise op lowerings (not PopART API)."""

from __future__ import annotations

FLOATS = ("FLOAT", "FLOAT16")


def dtype(ir, tid: str) -> str:
    """ONNX element type name of IR tensor ``tid`` ("FLOAT", "FLOAT16", "INT64", ...)."""
    return ir.tensors[tid].info.data_type()


def shape(ir, tid: str) -> list:
    return list(ir.tensors[tid].info.shape())


def graph(ctx, op):
    """The op's (virtual) graph."""
    return ctx.graph_of(ctx.vgraph_of(op))


def name(op) -> str:
    return f"{op.op_type}/{op.outputs[0]}"


def live_outputs(op) -> int:
    """Number of outputs up to the last one the model names (empty names are omitted outputs)."""
    n = 0
    for k, o in enumerate(op.outputs):
        if o:
            n = k + 1
    return n


def all_float(ir, op, inputs=None, outputs=1) -> bool:
    """Whether the given inputs (default all non-empty) and the first ``outputs`` outputs share
    one float type (FLOAT or FLOAT16)."""
    ids = [x for x in (op.inputs if inputs is None else [op.inputs[i] for i in inputs if i < len(op.inputs)]) if x]
    ids += [o for o in op.outputs[:outputs] if o]
    types = {dtype(ir, x) for x in ids}
    return len(types) == 1 and next(iter(types)) in FLOATS


def const_value(ir, tid: str):
    """The numpy value of a constant IR tensor, else None."""
    t = ir.tensors.get(tid)
    return None if t is None or t.kind != "Const" else t.value


def poplibs_options(op, session_options, default_partials=None) -> dict:
    """PopLibs options of a matmul or convolution op: the session's option map (``matmulOptions``
    / ``convolutionOptions``), then the op's partials type and ``availableMemoryProportion``
    annotations (``builder.setPartialsType`` / ``setAvailableMemoryProportion``)."""
    from openipu.popart.builder import AMP_ATTR, PARTIALS_ATTR
    opts = {k: str(v) for k, v in dict(session_options).items()}
    p = op.annotations.get(PARTIALS_ATTR) or default_partials
    if isinstance(p, bytes):
        p = p.decode()
    if p:
        opts["partialsType"] = str(p).lower()
    if AMP_ATTR in op.annotations:
        opts["availableMemoryProportion"] = float(op.annotations[AMP_ATTR])
    return opts


def comm_group(op):
    """The ``gcl.CommGroup`` of a collective's ``commGroup`` attribute ``[type, size]`` (PopART's
    CommGroupType values: All 0, Consecutive 1, Orthogonal 2, None 3 = groups of one), or None
    (all replicas)."""
    from openipu.poplibs import gcl as _gcl
    attr = op.attrs.get("commGroup")
    if not attr:
        return None
    t, size = int(attr[0]), int(attr[1])
    if t == 0 or (t in (1, 2) and size == 0):
        return None
    if t == 3:
        return _gcl.CommGroup(_gcl.CommGroupType.CONSECUTIVE, 1)
    return _gcl.CommGroup(_gcl.CommGroupType.CONSECUTIVE if t == 1 else _gcl.CommGroupType.ORTHOGONAL, size)
