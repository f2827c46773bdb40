"""Seeded mutations of small ONNX models, and a worker that runs them through ``openipu run``'s
runner API (imported by ``tests/test_fuzz_models.py``, run as a script for its worker).

A case is ``(seed, index)``: :func:`make_case` builds the mutated model deterministically from
it. Byte mutations flip, insert or delete bytes of a serialized base model, or truncate it;
structural mutations change attribute values (negative, zero, huge), input dims (0, -1, huge,
dropped), element types, node inputs, names (duplicates), edges (cycles) and op types (unknown
ops and domains), opsets and initializer data; input mutations feed extreme values (huge,
negative, NaN, out-of-range ids and CTC labels) to an unchanged model.

Worker protocol (``python tests/fuzz_models.py SEED FIRST LAST``): for each case it prints
``start <i>`` then one JSON line ``{"case", "kind", "outcome", "detail"}``, flushing each, so
that the parent can tell which case crashed (a signal) or hung (no line within its timeout).
Outcomes: ``ok`` (ran), ``refused`` (a clean error: ``popart_exception`` and the other PopART
/ Poplar errors, ``ValueError`` / ``FileNotFoundError`` as the CLI reports them), ``unclean``
(any other exception: a bug, reported with its traceback's last frame).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import traceback

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


#: the onnx package's light model that ``make fuzz`` adds (``OPENIPU_FUZZ_LIGHT=1``): the real
#: SqueezeNet graph, weights made by ConstantOfShape (a few seconds a case)
LIGHT = "light_squeezenet"


def base_models(light: bool = False) -> dict[str, onnx.ModelProto]:
    """Small real models: a conv net, an embedding / attention-like block, integer Div / Mod,
    two Builder models
    with ai.graphcore ops (gelu and ctcloss on constant targets; ctcloss on fed targets and
    lengths). All static, run in well under a second."""
    rng = np.random.default_rng(0)
    out = {}
    w = nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = nh.from_array(rng.standard_normal(8).astype(np.float32), "b")
    wg = nh.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "wg")
    fc = nh.from_array(rng.standard_normal((8, 10)).astype(np.float32), "fc")
    shape = nh.from_array(np.array([2, 8], np.int64), "shape")
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1],
                    dilations=[1, 1], group=1),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p1", "wg"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2),
        h.make_node("GlobalAveragePool", ["c2"], ["g"]),
        h.make_node("Reshape", ["g", "shape"], ["flat"]),
        h.make_node("MatMul", ["flat", "fc"], ["logits"]),
        h.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    g = h.make_graph(nodes, "convnet", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 10])], [w, b, wg, fc, shape])
    out["convnet"] = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])

    emb = nh.from_array(rng.standard_normal((16, 8)).astype(np.float32), "emb")
    wq = nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "wq")
    sc = nh.from_array(np.ones(8, np.float32), "ln_s")
    rep = nh.from_array(np.array([1, 1, 1], np.int64), "rep")
    cshape = nh.from_array(np.array([2, 4, 8], np.int64), "cshape")
    axes = nh.from_array(np.array([2], np.int64), "axes")
    nodes = [
        h.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
        h.make_node("MatMul", ["e", "wq"], ["q"]),
        h.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "qt"], ["att"]),
        h.make_node("Softmax", ["att"], ["sm"], axis=-1),
        h.make_node("MatMul", ["sm", "e"], ["ctx"]),
        h.make_node("ConstantOfShape", ["cshape"], ["ones"], value=nh.from_array(np.array([1.0], np.float32))),
        h.make_node("Add", ["ctx", "ones"], ["s"]),
        h.make_node("Tile", ["s", "rep"], ["t"]),
        h.make_node("LayerNormalization", ["t", "ln_s"], ["ln"], axis=-1, epsilon=1e-5),
        h.make_node("ReduceSum", ["ln", "axes"], ["y"], keepdims=1),
        h.make_node("Concat", ["y", "y"], ["z"], axis=2),
    ]
    g = h.make_graph(nodes, "attn", [h.make_tensor_value_info("ids", T.INT64, [2, 4])],
                     [h.make_tensor_value_info("z", T.FLOAT, [2, 4, 2])], [emb, wq, sc, rep, cshape, axes])
    out["attn"] = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    nodes = [h.make_node("Div", ["a", "b"], ["q"]), h.make_node("Mod", ["a", "b"], ["r"], fmod=0),
             h.make_node("Add", ["q", "r"], ["y"])]
    g = h.make_graph(nodes, "intmath", [h.make_tensor_value_info("a", T.INT32, [4]),
                                        h.make_tensor_value_info("b", T.INT32, [4])],
                     [h.make_tensor_value_info("y", T.INT32, [4])])
    out["intmath"] = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])

    import popart
    bld = popart.Builder()
    tt, n, c, s = 6, 2, 5, 3
    x = bld.addInputTensor(popart.TensorInfo("FLOAT", [tt, n, c]), "x")
    wt = bld.addInitializedInputTensor(np.ones([tt, n, c], np.float32), "w")
    tgt = bld.aiOnnx.constant(np.array([[1, 2, 2], [3, 1, 4]], np.int32), "tgt")
    il = bld.aiOnnx.constant(np.array([6, 5], np.int32), "il")
    tl = bld.aiOnnx.constant(np.array([3, 2], np.int32), "tl")
    lp = bld.aiOnnx.logsoftmax([bld.aiGraphcore.gelu([bld.aiOnnx.mul([x, wt])])], axis=2)
    loss = bld.aiGraphcore.ctcloss([lp, tgt, il, tl], popart.ReductionType.Mean, 0, zeroInfinity=True)
    bld.addOutputTensor(loss)
    out["graphcore_ctc"] = onnx.load_from_string(bld.getModelProto())

    bld = popart.Builder()
    x = bld.addInputTensor(popart.TensorInfo("FLOAT", [tt, n, c]), "x")
    tgt = bld.addInputTensor(popart.TensorInfo("INT32", [n, s]), "tgt")
    il = bld.addInputTensor(popart.TensorInfo("INT32", [n]), "il")
    tl = bld.addInputTensor(popart.TensorInfo("INT32", [n]), "tl")
    lp = bld.aiOnnx.logsoftmax([x], axis=2)
    loss = bld.aiGraphcore.ctcloss([lp, tgt, il, tl], popart.ReductionType.Sum, 0, zeroInfinity=True)
    bld.addOutputTensor(loss)
    out["graphcore_ctc_fed"] = onnx.load_from_string(bld.getModelProto())
    if light:
        from openipu import runner
        out[LIGHT] = onnx.load(str(runner.resolve_model(LIGHT)))
    return out


def _input_mutation(name: str, m: onnx.ModelProto, rnd: random.Random) -> tuple[str, dict]:
    """Extreme input values for the run-time inputs of ``m``: huge, negative, NaN / inf, out of
    range ids and labels."""
    from openipu import runner
    feeds = runner.random_inputs(m, seed=rnd.randrange(1000))
    vi = rnd.choice(runner.model_inputs(m))
    arr = feeds[vi.name]
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        v = rnd.choice([info.max, info.min, -1, 7, 100_000_000, 0])
    else:
        v = rnd.choice([np.nan, np.inf, -np.inf, 1e30, 0.0])
    flat = arr.reshape(-1)
    if flat.size:
        flat[rnd.randrange(flat.size)] = v
    return f"input-{vi.name}={v}", feeds


_HUGE = [0, -1, -2, -(1 << 31), (1 << 31) - 1, 1 << 31, 1 << 40, (1 << 63) - 1, 3, 1000]
_TYPES = [T.DOUBLE, T.STRING, T.COMPLEX64, T.BFLOAT16, T.INT8, T.UINT64, T.UNDEFINED, T.FLOAT16, T.INT32, T.BOOL,
          T.FLOAT8E4M3FN, 999]


def _byte_mutation(data: bytes, rnd: random.Random) -> tuple[str, bytes]:
    b = bytearray(data)
    kind = rnd.choice(["flip", "flip", "insert", "delete", "truncate", "overwrite"])
    if kind == "flip":
        for _ in range(rnd.randint(1, 8)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
    elif kind == "insert":
        i = rnd.randrange(len(b) + 1)
        b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16)))
    elif kind == "delete":
        i = rnd.randrange(len(b))
        del b[i:i + rnd.randint(1, 16)]
    elif kind == "truncate":
        del b[rnd.randrange(len(b)):]
    else:
        i = rnd.randrange(len(b))
        b[i:i + 4] = bytes(rnd.choice([0x00, 0xff, 0x7f, 0x80]) for _ in range(4))
    return f"bytes-{kind}", bytes(b)


def _structural_mutation(m: onnx.ModelProto, rnd: random.Random) -> str:
    g = m.graph
    kind = rnd.choice(["attr", "attr", "attr", "dim", "dim", "dtype", "drop_input", "dup_name", "cycle",
                       "unknown_op", "opset", "init_dims", "init_data", "rename_output", "attr_type", "const_value"])
    nodes = list(g.node)
    if kind == "attr":
        cands = [(n, a) for n in nodes for a in n.attribute if a.type in (onnx.AttributeProto.INT,
                                                                            onnx.AttributeProto.INTS)]
        if cands:
            n, a = rnd.choice(cands)
            v = rnd.choice(_HUGE)
            if a.type == onnx.AttributeProto.INT:
                a.i = v
            elif a.ints:
                a.ints[rnd.randrange(len(a.ints))] = v
            else:
                a.ints.append(v)
            return f"attr-{n.op_type}.{a.name}={v}"
        kind = "dim"
    if kind == "const_value":
        inits = [t for t in g.initializer if t.data_type == T.INT64]
        if inits:
            t = rnd.choice(inits)
            arr = nh.to_array(t).copy()
            if arr.size:
                arr.reshape(-1)[rnd.randrange(arr.size)] = rnd.choice(_HUGE)
                t.CopyFrom(nh.from_array(arr, t.name))
                return f"const-{t.name}"
        kind = "dim"
    if kind == "dim":
        vis = [vi for vi in list(g.input) + list(g.output) if vi.type.tensor_type.shape.dim]
        if vis:
            vi = rnd.choice(vis)
            dims = vi.type.tensor_type.shape.dim
            d = dims[rnd.randrange(len(dims))]
            choice = rnd.choice(["0", "-1", "huge", "param", "drop"])
            if choice == "drop":
                del dims[len(dims) - 1]
            elif choice == "param":
                d.dim_param = "n"
            else:
                d.dim_value = {"0": 0, "-1": -1, "huge": 1 << 40}[choice]
            return f"dim-{vi.name}-{choice}"
        kind = "dtype"
    if kind == "dtype":
        vi = rnd.choice(list(g.input) + list(g.output))
        t = rnd.choice(_TYPES)
        vi.type.tensor_type.elem_type = t
        return f"dtype-{vi.name}-{t}"
    if kind == "drop_input" and nodes:
        n = rnd.choice([n for n in nodes if n.input] or nodes)
        if n.input:
            i = rnd.randrange(len(n.input))
            if rnd.random() < 0.5:
                del n.input[i]
            else:
                n.input[i] = ""
        return f"drop_input-{n.op_type}"
    if kind == "dup_name" and len(nodes) > 1:
        a, b = rnd.sample(nodes, 2)
        if a.output and b.output:
            a.output[0] = b.output[0]
        return f"dup_name-{a.op_type}-{b.op_type}"
    if kind == "cycle" and nodes:
        first, last = nodes[0], nodes[-1]
        first.input.append(last.output[0])
        if rnd.random() < 0.5 and first.input:
            first.input[0] = last.output[0]
        return "cycle"
    if kind == "unknown_op" and nodes:
        n = rnd.choice(nodes)
        if rnd.random() < 0.5:
            n.op_type = "FooBar"
        else:
            n.domain = "com.example.unknown"
        return f"unknown_op-{n.op_type}"
    if kind == "opset":
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = rnd.choice([1, 5, 9, 99, 0, -3])
                return f"opset-{o.version}"
    if kind in ("init_dims", "init_data") and g.initializer:
        t = rnd.choice(list(g.initializer))
        if kind == "init_dims" and t.dims:
            t.dims[rnd.randrange(len(t.dims))] = rnd.choice([0, -1, 1 << 40, 7])
        elif t.raw_data:
            t.raw_data = t.raw_data[:rnd.randrange(len(t.raw_data))]
        else:
            t.ClearField("float_data") if t.float_data else t.ClearField("int64_data")
        return f"{kind}-{t.name}"
    if kind == "rename_output" and g.output:
        g.output[0].name = "nowhere"
        return "rename_output"
    if kind == "attr_type" and nodes:
        n = rnd.choice(nodes)
        n.attribute.append(h.make_attribute(rnd.choice(["axis", "kernel_shape", "perm", "to", "group"]),
                                            rnd.choice(["text", 1.5, [1.0, 2.0], -7])))
        return f"attr_type-{n.op_type}"
    return "none"


def make_case(seed: int, index: int, bases: dict) -> tuple[str, bytes, dict | None]:
    """The mutated model of case ``index``: ``(kind, serialized bytes, inputs or None)``,
    deterministic in ``(seed, index)``. A quarter mutate bytes, a sixth feed extreme input
    values to the unchanged model, the rest mutate the structure."""
    rnd = random.Random(seed * 1_000_003 + index)
    light = rnd.random() < 0.1 and LIGHT in bases
    name = rnd.choice(sorted(b for b in bases if b != LIGHT))
    name = LIGHT if light else name
    m = onnx.ModelProto()
    m.CopyFrom(bases[name])
    r = rnd.random()
    if r < 0.25:
        kind, data = _byte_mutation(m.SerializeToString(), rnd)
        return f"{name}:{kind}", data, None
    if r < 0.42:
        kind, feeds = _input_mutation(name, m, rnd)
        return f"{name}:{kind}", m.SerializeToString(), feeds
    kinds = [_structural_mutation(m, rnd) for _ in range(rnd.choice([1, 1, 2]))]
    return f"{name}:{'+'.join(kinds)}", m.SerializeToString(), None


def clean_error(e: BaseException) -> bool:
    """An error ``openipu run`` reports as one line of its own (not the unexpected-error guard)."""
    from openipu import runner  # noqa: F401
    if isinstance(e, (ValueError, FileNotFoundError, MemoryError)):
        return True
    return type(e).__module__.startswith(("openipu.popart", "openipu.poplar", "openipu.poplibs"))


def run_case(path: str, index: int, inputs: dict | None = None) -> tuple[str, str]:
    """Run the model at ``path`` through :func:`openipu.runner.run_model` (functional, 64
    tiles; every fourth case without inputs offline). Returns ``(outcome, detail)``."""
    from openipu import runner
    try:
        res = runner.run_model(path, tiles_per_ipu=64, seed=index, offline=inputs is None and index % 4 == 3,
                               inputs=inputs)
        return "ok", "fits" if res.fits else "does not fit"
    except Exception as e:  # noqa: BLE001 - classified
        text = " ".join(str(e).split())[:300]
        if clean_error(e):
            return "refused", f"{type(e).__name__}: {text}"
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return "unclean", f"{type(e).__name__}: {text} at {tb.filename}:{tb.lineno}"


def worker(seed: int, first: int, last: int) -> None:
    import logging
    logging.disable(logging.WARNING)
    bases = base_models(light=os.environ.get("OPENIPU_FUZZ_LIGHT", "0") == "1")
    with tempfile.TemporaryDirectory() as d:
        for i in range(first, last):
            kind, data, inputs = make_case(seed, i, bases)
            path = os.path.join(d, f"case{i}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            print(f"start {i}", flush=True)
            outcome, detail = run_case(path, i, inputs)
            print(json.dumps({"case": i, "kind": kind, "outcome": outcome, "detail": detail}), flush=True)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
