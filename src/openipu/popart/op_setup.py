"""PopART's ``Op::setup()`` checks of attributes against input shapes and types, raised when the
session is created (PopART builds and sets up every op in the ``InferenceSession`` /
``TrainingSession`` constructor), not at ``prepareDevice`` or ``run``.

:func:`check` is called by :class:`openipu.popart.ir.Ir` for every node, folded or not, with the
input types and shapes (and the values of constant inputs). Each check raises
``popart_exception`` with PopART's wording where PopART has one (``willow/src/op/*.cpp``, cited
per check), else a message in the same style. ``op_str`` is PopART's ``Op::str()``:
``"<id> (<domain>.<type>:<version>)"``.

Checked: the axes of the reductions (ONNX ``Reduce*``, ``ai.graphcore`` ``ReduceMedian``),
``ArgMax`` / ``ArgMin``, ``Softmax`` / ``LogSoftmax`` / ``Hardmax``, ``Concat``, ``Gather``,
``Split`` (and its sizes), ``Flatten``, ``Squeeze`` / ``Unsqueeze``, ``CumSum``, ``Slice``,
``TopK`` (``k``), ``ai.graphcore`` ``Sort``; ``Transpose``'s ``perm``; negative sizes
(``Reshape`` below -1, ``Tile`` repeats, ``ai.graphcore`` ``DynamicSlice`` / ``DynamicUpdate``
sizes); element types ops do not take (float-only math on integer or bool tensors, PopART's
``OpDefinition`` type lists; inputs of different types to elementwise ops, except PopART's
FLOAT16 x FLOAT-scalar ``Mul``, see :func:`mixed_output_type`); the ``dtype`` of
``RandomNormal`` / ``RandomUniform``.
"""

from __future__ import annotations

import numpy as np
import onnx

from openipu.popart.errors import popart_exception

GRAPHCORE = "ai.graphcore"
FLOATS = ("FLOAT", "FLOAT16")
REDUCE_OPS = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
              "ReduceProd", "ReduceSum", "ReduceSumSquare"}
#: ops whose PopART ``OpDefinition`` takes float tensors only (``T = {FLOAT16, FLOAT}``)
FLOAT_ONLY = {"Sqrt", "Exp", "Log", "Reciprocal", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
              "Asinh", "Acosh", "Atanh", "Tanh", "Sigmoid", "Erf", "Softmax", "LogSoftmax", "Softplus", "Softsign",
              "Elu", "Selu", "HardSigmoid", "LeakyRelu", "ThresholdedRelu", "Gelu", "Conv", "ConvTranspose",
              "AveragePool", "GlobalAveragePool", "LpPool", "BatchNormalization", "InstanceNormalization",
              "LayerNormalization", "GroupNormalization", "LRN", "RNN", "GRU", "LSTM", "RandomNormalLike",
              "RandomUniformLike", "Ceil", "Floor", "Round", "IsInf", "IsNaN"}
#: ``ai.graphcore`` ops taking float tensors only
GRAPHCORE_FLOAT_ONLY = {"Gelu", "GeluErf", "Swish", "Expm1", "Log1p", "GroupNormalization", "Nll"}
#: the element types RandomNormal / RandomUniform make (PopART: FLOAT16 and FLOAT)
RANDOM_DTYPES = {1: "FLOAT", 10: "FLOAT16"}


def op_version(domain: str, op_type: str, opset: int) -> int:
    """The version of ``op_type`` an opset-``opset`` model uses (PopART prints it in op names,
    ``ai.onnx.ReduceSum:1``); ``opset`` itself when onnx has no schema for it."""
    if domain not in ("", "ai.onnx"):
        return 1
    try:
        return int(onnx.defs.get_schema(op_type, opset, "").since_version)
    except Exception:  # noqa: BLE001 - ops onnx does not define (or newer than this onnx)
        return opset


def _fmt(v) -> str:
    """A shape or list as PopART prints vectors: ``[2 3 4]``."""
    return "[" + " ".join(str(int(x)) for x in v) + "]"


def _ints(v) -> list[int] | None:
    if v is None:
        return None
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _axes(attrs: dict, values: list, opset: int, op_type: str, input_from: int | None, idx: int = 1):
    """``axes`` of a node: the attribute, or (newer opsets) the constant input ``idx``."""
    if "axes" in attrs:
        return _ints(attrs["axes"])
    if input_from is not None and opset >= input_from and idx < len(values):
        return _ints(values[idx])
    return None


#: ops whose inputs must share one element type (PopART's ``prettyNpOut`` with its type check:
#: ``ElementWiseBinaryBaseOp``, ``VariadicOp``, ``WhereOp`` x / y); op -> the inputs compared
SAME_TYPE = {("", t): None for t in ("Add", "Sub", "Div", "Mod", "PRelu", "Max", "Min", "Sum", "Mean")}
SAME_TYPE.update({("", "Where"): (1, 2), ("", "Pow"): None})
SAME_TYPE.update({(GRAPHCORE, t): None for t in ("Atan2", "Fmod", "Remainder", "BitwiseAnd", "BitwiseOr",
                                                  "BitwiseXor", "BitwiseXnor")})


def mixed_output_type(domain: str, op_type: str, infos: list) -> str | None:
    """PopART's ``MulOp``: FLOAT16 times a FLOAT scalar (one element), either way round, is
    FLOAT16 (``isFp16Fp32ScalarMixedPrecision``). Returns that type, or None when the inputs are
    not such a pair."""
    if (domain, op_type) != ("", "Mul") or len(infos) != 2 or None in infos:
        return None
    (t0, s0), (t1, s1) = infos

    def half_or_scalar(t, shape):
        return t == "FLOAT16" or (t == "FLOAT" and shape is not None and int(np.prod(shape)) == 1)
    if t0 != t1 and half_or_scalar(t0, s0) and half_or_scalar(t1, s1):
        return "FLOAT16"
    return None


def _same_types(domain: str, op_type: str, opset: int, infos: list, op_str: str) -> None:
    """willow/src/tensorinfo.cpp ``npOutDataTypeExceptionMessage`` (raised by ``npOut``)."""
    key = (domain, op_type)
    if key == ("", "Pow") and opset >= 12:     # ONNX Pow-12: base and exponent types may differ
        return
    if key not in SAME_TYPE and key != ("", "Mul"):
        return
    idx = SAME_TYPE.get(key) or range(len(infos))
    ins = [infos[i] for i in idx if i < len(infos) and infos[i] is not None]
    for a in ins[1:]:
        if a[0] != ins[0][0]:
            if mixed_output_type(domain, op_type, infos):
                return
            raise popart_exception(f"np broadcasting failed on Op {op_str}, incompatible types {ins[0][0]} and {a[0]} "
                                   f"(shapes {_fmt(ins[0][1] or [])} and {_fmt(a[1] or [])})")


def check(domain: str, op_type: str, opset: int, attrs: dict, infos: list, values: list, op_str: str) -> None:
    """Check one op. ``infos``: ``(dtype, shape)`` or None per input; ``values``: numpy value of
    each constant input, else None. Raises ``popart_exception``."""
    _same_types(domain, op_type, opset, infos, op_str)
    if domain == GRAPHCORE:
        return _graphcore(op_type, attrs, infos, values, op_str)
    if domain != "":
        return None
    if op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike") and "dtype" in attrs:
        from openipu.popart.tensorinfo import dtype_name
        name = dtype_name(int(attrs["dtype"]))
        if name not in FLOATS:
            # willow/src/op/shapeorlike.cpp (RandomBaseOp::supportedDataTypes: FLOAT16, FLOAT)
            raise popart_exception(f"ai.onnx.{op_type}:{op_version('', op_type, opset)} : Unsupported data type "
                                   f"requested: {name}")
    x = infos[0] if infos else None
    rank = len(x[1]) if x is not None and x[1] is not None else None
    if x is not None and op_type in FLOAT_ONLY and x[0] not in FLOATS + ("DOUBLE", "BFLOAT16"):
        raise popart_exception(f"Op {op_str} does not take input 0 of type {x[0]}: its types are "
                               f"{{FLOAT16, FLOAT}}. Cast the input (builder.aiOnnx.cast)")
    if rank is None:
        return None
    if op_type in REDUCE_OPS:
        input_from = 13 if op_type == "ReduceSum" else 18
        _reduce_axes(_axes(attrs, values, opset, op_type, input_from), rank, op_str)
    elif op_type in ("ArgMax", "ArgMin"):
        _arg_axis(int(attrs.get("axis", 0)), rank, op_str)
    elif op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
        if not -rank <= axis <= rank - 1:
            # willow/src/op/logsoftmax.cpp (SoftmaxOp reads its axis alike)
            raise popart_exception(f"{op_type} axis, {axis}, is outside of acceptable range [{-rank}, {rank - 1}]")
    elif op_type == "Concat":
        axis = int(attrs.get("axis", 0))
        if not -rank <= axis <= rank - 1:
            # willow/src/op/concat.cpp
            raise popart_exception(f"Attribute 'axis' of ConcatOp, {axis}, is outside of acceptable range "
                                   f"[{-rank}, {rank - 1}]")
    elif op_type == "Gather":
        axis = int(attrs.get("axis", 0))
        if not -rank <= axis <= rank - 1:
            # willow/src/op/gather.cpp
            raise popart_exception(f"GatherOp::setup axis = {axis} is outside the acceptable range "
                                   f"[{-rank}, {rank - 1}]")
    elif op_type == "Split":
        _split(attrs, values, opset, x[1], op_str)
    elif op_type == "Flatten":
        axis = int(attrs.get("axis", 1))
        if not -rank <= axis <= rank:
            raise popart_exception(f"Flatten axis, {axis}, is outside of acceptable range [{-rank}, {rank}], invalid "
                                   f"Op {op_str}")
    elif op_type == "Squeeze":
        axes = _axes(attrs, values, opset, op_type, 13)
        for a in axes or ():
            if not -rank <= a <= rank - 1:
                raise popart_exception(f"Squeeze axis {a} is out of range for tensor with {rank} dims, invalid Op "
                                       f"{op_str}")
            if x[1][a % rank] != 1:
                raise popart_exception(f"Cannot squeeze axis {a} of size {x[1][a % rank]} (not 1) of a tensor of shape "
                                       f"{_fmt(x[1])}, invalid Op {op_str}")
    elif op_type == "Unsqueeze":
        axes = _axes(attrs, values, opset, op_type, 13)
        if axes is not None:
            out_rank = rank + len(axes)
            norm = [a + out_rank if a < 0 else a for a in axes]
            if any(not 0 <= a < out_rank for a in norm):
                raise popart_exception(f"Unsqueeze axes {_fmt(axes)} are out of range for an output of rank "
                                       f"{out_rank}, invalid Op {op_str}")
            if len(set(norm)) != len(norm):
                raise popart_exception(f"Unsqueeze axes {_fmt(axes)} are not unique, invalid Op {op_str}")
    elif op_type == "Transpose":
        perm = _ints(attrs.get("perm"))
        if perm:
            if len(perm) != rank:
                # willow/src/op/transpose.cpp
                raise popart_exception(f"Rank of permutation tensor {_fmt(perm)}, rank {len(perm)} must be equal to "
                                       f"rank of input tensor, shape {_fmt(x[1])}, rank {rank}.")
            if sorted(perm) != list(range(rank)):
                raise popart_exception(f"Permutation {_fmt(perm)} of Op {op_str} is not a permutation of the "
                                       f"{rank} input dimensions (each of 0..{rank - 1} exactly once)")
    elif op_type == "CumSum":
        axis = _ints(values[1]) if len(values) > 1 else None
        if axis is not None:
            if len(axis) != 1:
                raise popart_exception("CumSum op, 'axis' tensor must have one element.")
            if not -rank <= axis[0] <= rank - 1:
                raise popart_exception(f"CumSum axis {axis[0]} is outside of acceptable range [{-rank}, {rank - 1}], "
                                       f"invalid Op {op_str}")
        for k in ("exclusive", "reverse"):
            if int(attrs.get(k, 0)) not in (0, 1):
                raise popart_exception(f"CumSum op, '{k}' attributes must be 0 or 1.")
    elif op_type == "Slice":
        axes = _ints(attrs["axes"]) if "axes" in attrs else (_ints(values[3]) if len(values) > 3 else None)
        for a in axes or ():
            if a >= rank or -a > rank:
                # willow/src/op/slice.cpp
                raise popart_exception(f"Invalid input shape in BaseSliceOp::getSlices. The input shape has rank "
                                       f"{rank}, but axis = {a}. axis must be less than the input shape's rank. "
                                       f"This error is for Op {op_str}.")
    elif op_type == "TopK":
        axis = int(attrs.get("axis", -1))
        _arg_axis(axis, rank, op_str, name="TopKOp")
        k = int(attrs["k"]) if "k" in attrs else (_ints(values[1])[0] if len(values) > 1 and values[1] is not None
                                                  else None)
        if k is not None:
            dim = x[1][axis % rank]
            if k < 0:
                raise popart_exception(f"Cannot take top-k with k = {k} (negative) on dim of size {dim}, invalid Op "
                                       f"{op_str}")
            if k > dim:
                # willow/src/op/topk.cpp
                raise popart_exception(f"Cannot take top-{k} on dim of size {dim}, invalid Op {op_str}")
    elif op_type == "Reshape":
        shape = _ints(values[1]) if len(values) > 1 else None
        bad = [d for d in shape or () if d < -1]
        if bad:
            # willow/src/op/reshape.cpp
            raise popart_exception(f"Dimension, {bad[0]}, of new shape for Reshape cannot be smaller than -1.")
        if shape is not None and shape.count(-1) > 1:
            raise popart_exception("shape input to ReshapeOp can only use -1 to specify one unknown dimension")
    elif op_type == "Tile":
        reps = _ints(values[1]) if len(values) > 1 else None
        if reps is not None and any(r < 0 for r in reps):
            raise popart_exception(f"Tile repeats {_fmt(reps)} of Op {op_str} must not be negative")
    return None


def _reduce_axes(axes, rank: int, op_str: str, name: str = "ReduceOp") -> None:
    """willow/src/op/reduce.cpp ``ReduceOp::validateAxis`` (axes normalised first: a negative
    axis below ``-rank`` is reported as the negative value it normalises to)."""
    for a in axes or ():
        if rank == 0:
            raise popart_exception(f"{name} input rank must be greater than 0, invalid {name} {op_str}.")
        n = a + rank if a < 0 else a
        if not 0 <= n < rank:
            raise popart_exception(f"Cannot compute {name} on axis {n} when input rank is {rank}, invalid {name} "
                                   f"{op_str}.")


def _arg_axis(axis: int, rank: int, op_str: str, name: str = "ArgExtremaOp") -> None:
    """willow/src/op/argextrema.cpp ``ArgExtremaOp::validateAxis``."""
    if rank == 0:
        raise popart_exception(f"{name} input rank must be greater than 0, invalid {name} {op_str}.")
    if axis >= rank:
        raise popart_exception(f"Cannot compute {name} on axis {axis} when input rank is {rank}, invalid {name} "
                               f"{op_str}.")
    if axis < -rank:
        raise popart_exception(f"Axis {axis} is out of acceptable range [{-rank}, {rank - 1}]")


def _split(attrs: dict, values: list, opset: int, shape, op_str: str) -> None:
    """willow/src/op/split.cpp ``SplitOp::setup``."""
    rank = len(shape)
    axis = int(attrs.get("axis", 0))
    n = axis + rank if axis < 0 else axis
    if not 0 <= n < rank:
        raise popart_exception(f"Axis {axis} is out of range for tensor with {rank} dims")
    sizes = _ints(attrs["split"]) if "split" in attrs else (_ints(values[1]) if len(values) > 1 else None)
    if sizes:
        if any(s < 0 for s in sizes):
            raise popart_exception(f"Split sizes {_fmt(sizes)} of Op {op_str} must not be negative")
        if sum(sizes) != shape[n]:
            raise popart_exception(f"splits {sum(sizes)} invalid for dimension of size {shape[n]}")


def _graphcore(op_type: str, attrs: dict, infos: list, values: list, op_str: str) -> None:
    x = infos[0] if infos else None
    if x is None or x[1] is None:
        return
    rank = len(x[1])
    if op_type in GRAPHCORE_FLOAT_ONLY and x[0] not in FLOATS:
        raise popart_exception(f"Op {op_str} does not take input 0 of type {x[0]}: its types are "
                               f"{{FLOAT16, FLOAT}}. Cast the input (builder.aiOnnx.cast)")
    if op_type == "ReduceMedian":       # a ReduceOp (willow/src/op/reducemedian.cpp)
        _reduce_axes(_ints(attrs.get("axes")), rank, op_str)
    elif op_type == "Sort":
        _arg_axis(int(attrs.get("axis", -1)), rank, op_str, name="SortOp")
    elif op_type in ("DynamicSlice", "DynamicUpdate", "DynamicZero", "DynamicAdd"):
        sizes = _ints(attrs.get("sizes"))
        axes = _ints(attrs.get("axes"))
        if sizes is not None and any(s < 0 for s in sizes):
            raise popart_exception(f"{op_type} sizes {_fmt(sizes)} of Op {op_str} must not be negative")
        for a in axes or ():
            if not 0 <= a < rank:
                raise popart_exception(f"{op_type} axis {a} of Op {op_str} is out of range for a tensor of rank {rank}")
    elif op_type == "ScatterReduce":
        axis = int(attrs.get("axis", -1))
        if not -rank <= axis <= rank - 1:
            # willow/src/op/scatterreduce.cpp
            raise popart_exception(f"ScatterReduceOp::setup axis = {axis} is outside the acceptable range "
                                   f"[{-rank}, {rank - 1}]")


def check_graph(model, shapes: dict) -> None:
    """Run :func:`check` over every node of ``model``'s main graph (an ``onnx.ModelProto``) from
    ``shapes`` (tensor name -> ``(dtype name, shape)``, e.g. non-strict ONNX inference), the
    values of initializers and ``Constant`` nodes standing for constant inputs. For a caller that
    must report PopART's error before another check sees the node (strict ONNX inference, whose
    wording differs). Raises ``popart_exception``: PopART's message, then `` (node '<name>')``
    (the node's name, else its first output)."""
    from onnx import numpy_helper

    from openipu.popart.shapes import decode_attrs
    opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): int(o.version) for o in model.opset_import}
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
              if i.data_location != onnx.TensorProto.EXTERNAL}
    for k, node in enumerate(model.graph.node):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        attrs = decode_attrs(node)
        if node.op_type == "Constant" and domain == "" and "value" in attrs:
            values[node.output[0]] = np.asarray(attrs["value"])
            continue
        opset = opsets.get(domain, 1)
        infos = [shapes.get(x) if x else None for x in node.input]
        vals = [values.get(x) if x else None for x in node.input]
        try:
            check(domain, node.op_type, opset, attrs, infos, vals,
                  f"{k} ({domain or 'ai.onnx'}.{node.op_type}:{op_version(domain, node.op_type, opset)})")
        except popart_exception as e:
            # PopART's words first (tests match them from the start), then the node they are about
            name = node.name or (node.output[0] if node.output else "")
            raise popart_exception(f"{e} (node '{name}')" if name else str(e)) from None
