"""PopRT's converter and passes on real models: all-MiniLM-L6-v2 with its real weights (exported
as in test_models.py; a copy with LayerNormalization and Gelu decomposed into the primitive ops
older exporters write, so the pattern passes have patterns to find) and the light ONNX models.

Each pass: the pattern was found (``Pass.applied``), and the rewritten model computes the same
outputs (PopART session on the simulated IPU, or onnxruntime) within tolerance.
"""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as oh
from onnx import numpy_helper

import poprt
from openipu import runner
from openipu.poprt.converter import ConverterError
from openipu.poprt.passes import GraphView, Pass, PassError, get_registered_passes, register

BUILTIN = ["int64_to_int32", "gelu_pattern", "erf_gelu_pattern", "layer_norm_pattern", "fused_attention",
           "attention_padding", "insert_attention_mask", "remove_initializer_from_input", "pre_scale"]


@pytest.fixture(scope="module")
def minilm(minilm_export):
    path, data = minilm_export
    return onnx.load(str(path)), data


def _session(model, data, ipu="ipu2", outputs=("last_hidden_state",), feeds=None):
    import popart
    dev = popart.DeviceManager().createIpuModelDevice({"ipuVersion": ipu, "tilesPerIPU": 1472})
    s = popart.InferenceSession(fnModel=model.SerializeToString(),
                                dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL") for o in outputs}),
                                deviceInfo=dev)
    s.prepareDevice()
    a = s.initAnchorArrays()
    feeds = feeds or {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    s.run(popart.PyStepIO(feeds, a))
    return a[outputs[0]], s.getCycleCount()


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def decompose(model: onnx.ModelProto, gelu: str = "erf") -> onnx.ModelProto:
    """``model`` with each ``LayerNormalization`` (last axis) and ``Gelu`` written out in primitive
    ops the way pre-opset-17 exporters write them: ``ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
    Div, Mul, Add``; erf GELU ``Div(x, sqrt 2), Erf, Add 1, Mul x, Mul 0.5``; or (``gelu='tanh'``)
    the tanh approximation ``x * 0.5 * (1 + Tanh(0.79788456 * (x + 0.044715 * x^3)))``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    nodes = []
    k = [0]

    def c(v, dt=np.float32):
        k[0] += 1
        name = f"dec_c{k[0]}"
        g.initializer.append(numpy_helper.from_array(np.array(v, dt), name))
        return name

    def t(stem):
        k[0] += 1
        return f"dec_{stem}{k[0]}"

    for n in g.node:
        if n.op_type == "LayerNormalization":
            x, gamma, beta = n.input[0], n.input[1], n.input[2]
            eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
            axes = c([-1], np.int64)
            m, d, sq, v, ve, s, nrm, sc = (t(s) for s in ("mean", "d", "sq", "var", "ve", "std", "norm", "sc"))
            nodes += [oh.make_node("ReduceMean", [x, axes], [m], keepdims=1), oh.make_node("Sub", [x, m], [d]),
                      oh.make_node("Pow", [d, c(2.0)], [sq]), oh.make_node("ReduceMean", [sq, axes], [v], keepdims=1),
                      oh.make_node("Add", [v, c(eps)], [ve]), oh.make_node("Sqrt", [ve], [s]),
                      oh.make_node("Div", [d, s], [nrm]), oh.make_node("Mul", [nrm, gamma], [sc]),
                      oh.make_node("Add", [sc, beta], [n.output[0]])]
        elif n.op_type == "Gelu" and gelu == "erf":
            x = n.input[0]
            a, e, p, q = t("a"), t("e"), t("p"), t("q")
            nodes += [oh.make_node("Div", [x, c(1.4142135381698608)], [a]), oh.make_node("Erf", [a], [e]),
                      oh.make_node("Add", [e, c(1.0)], [p]), oh.make_node("Mul", [x, p], [q]),
                      oh.make_node("Mul", [q, c(0.5)], [n.output[0]])]
        elif n.op_type == "Gelu":
            x = n.input[0]
            cube, cs, inner, sc, th, p, h = (t(s) for s in ("cube", "cs", "inner", "sc", "th", "p", "h"))
            nodes += [oh.make_node("Pow", [x, c(3.0)], [cube]), oh.make_node("Mul", [cube, c(0.044715)], [cs]),
                      oh.make_node("Add", [x, cs], [inner]), oh.make_node("Mul", [inner, c(0.7978845608)], [sc]),
                      oh.make_node("Tanh", [sc], [th]), oh.make_node("Add", [th, c(1.0)], [p]),
                      oh.make_node("Mul", [x, c(0.5)], [h]), oh.make_node("Mul", [h, p], [n.output[0]])]
        else:
            nodes.append(n)
    copies = []
    for n in nodes:
        cp = onnx.NodeProto()
        cp.CopyFrom(n)
        copies.append(cp)
    del g.node[:]
    g.node.extend(copies)
    return out


# -- registry ---------------------------------------------------------------------------------
def test_registry_lists_the_builtin_passes_and_rejects_unknown_names():
    names = get_registered_passes()
    for n in BUILTIN:
        assert n in names and isinstance(Pass.get_pass(n), Pass)
    assert poprt.Pass is Pass and poprt.get_registered_passes() == names
    with pytest.raises(PassError, match="Pass 'no_such_pass' is not registered"):
        Pass.get_pass("no_such_pass")
    with pytest.raises(PassError):
        poprt.Converter(used_passes=["no_such_pass"])


def test_custom_pass_registered_with_the_decorator_runs_in_the_converter():
    """PopRT's custom-pass example: replace Add with Sub, registered with ``@register``."""
    from poprt.passes import register as reg  # the drop-in module's path

    assert reg is register

    @register("replace_add_with_sub_test")
    class ReplaceAddWithSub(Pass):
        def run(self, model):
            def fn(graph, is_main_graph):      # PopRT's traverse_graph: transform(graph, is_main_graph)
                for node in graph.node:
                    if node.op_type == "Add":
                        node.op_type = "Sub"
                        self.applied.append(node.output[0])
                return graph
            self.traverse_graph(model.graph, fn)
            return model

    g = oh.make_graph([oh.make_node("Add", ["a", "b"], ["c"])], "g",
                      [oh.make_tensor_value_info("a", 1, [3]), oh.make_tensor_value_info("b", 1, [3])],
                      [oh.make_tensor_value_info("c", 1, [3])])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    conv = poprt.Converter(used_passes=["replace_add_with_sub_test"])
    out = conv.convert(m)
    assert conv.applied["replace_add_with_sub_test"] == ["c"]
    a, b = np.array([1, 2, 3], np.float32), np.array([3, 2, 1], np.float32)
    np.testing.assert_array_equal(_ort(out, {"a": a, "b": b})[0], a - b)
    assert m.graph.node[0].op_type == "Add"           # the input model is not modified


# -- pattern passes on MiniLM -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("pass_name,gelu,count", [("layer_norm_pattern", "erf", 13), ("erf_gelu_pattern", "erf", 6),
                                                  ("gelu_pattern", "tanh", 6)])
def test_pattern_pass_on_decomposed_minilm(minilm, pass_name, gelu, count):
    model, data = minilm
    dec = decompose(model, gelu)
    assert not any(n.op_type in ("LayerNormalization", "Gelu") for n in dec.graph.node)
    feeds = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    ref = _ort(dec, feeds)[0]
    if gelu == "erf":   # the decomposition is exact: onnxruntime gives PyTorch's output
        assert np.abs(ref - data["last_hidden_state"]).max() < 1e-4
    p = Pass.get_pass(pass_name)
    out = p(dec)
    assert len(p.applied) == count
    fused = {"layer_norm_pattern": "LayerNormalization", "erf_gelu_pattern": "GeluErf", "gelu_pattern": "Gelu"}[pass_name]
    assert sum(n.op_type == fused for n in out.graph.node) == count
    assert len(out.graph.node) < len(dec.graph.node)
    y, _ = _session(out, data)
    err = float(np.abs(y - ref).max())
    print(f"{pass_name}: {count} patterns fused; max |fused - onnxruntime(decomposed)| = {err:.3g}")
    assert err < 1e-4


def test_fused_attention_and_pre_scale_on_minilm_keep_outputs_and_cost_less(minilm):
    model, data = minilm
    y0, c0 = _session(model, data)
    conv = poprt.Converter(used_passes=["pre_scale", "fused_attention"])
    out = conv.convert(model)
    assert len(conv.applied["pre_scale"]) == 6 and len(conv.applied["fused_attention"]) == 6
    assert sum(n.op_type == "FusedAttention" and n.domain == "ai.graphcore" for n in out.graph.node) == 6
    assert not any(n.op_type == "Softmax" for n in out.graph.node)
    y1, c1 = _session(out, data)
    err = float(np.abs(y1 - data["last_hidden_state"]).max())
    print(f"all-MiniLM-L6-v2: predicted IPU cycles {c0:,} unfused -> {c1:,} with fused attention; "
          f"max |fused - PyTorch| = {err:.3g}")
    assert err < 1e-4
    assert c1 < c0


@pytest.mark.slow
def test_pre_scale_alone_moves_the_scale_off_the_scores(minilm):
    model, data = minilm
    p = Pass.get_pass("pre_scale")
    out = p(model)
    assert len(p.applied) == 6
    # one Mul per attention is gone (K^T's scale folded into Q's)
    assert sum(n.op_type == "Mul" for n in out.graph.node) == sum(n.op_type == "Mul" for n in model.graph.node) - 6
    y, _ = _session(out, data)
    assert float(np.abs(y - data["last_hidden_state"]).max()) < 1e-4


@pytest.mark.slow
def test_insert_attention_mask_restores_the_padding_mask(minilm):
    model, data = minilm
    mask = data["attention_mask"].copy()
    mask[1, 10:] = 0                                    # the second sentence padded after 10 tokens
    feeds = {"input_ids": data["input_ids"], "attention_mask": mask}
    ref = _ort(model, feeds)[0]
    fused = Pass.get_pass("fused_attention")(model)
    unmasked = onnx.ModelProto()
    unmasked.CopyFrom(fused)
    for n in unmasked.graph.node:
        if n.op_type == "FusedAttention":
            del n.input[3]
    y_un, _ = _session(unmasked, data, feeds=feeds)
    assert float(np.abs(y_un - ref).max()) > 1e-2       # without the mask the output differs
    p = Pass.get_pass("insert_attention_mask")
    masked = p(unmasked)
    assert len(p.applied) == 6
    y, _ = _session(masked, data, feeds=feeds)
    assert float(np.abs(y - ref).max()) < 1e-3


@pytest.mark.slow
def test_attention_padding_keeps_outputs(minilm):
    model, data = minilm
    fused = Pass.get_pass("fused_attention")(model)
    p = Pass.get_pass("attention_padding", pad_to=24)
    out = p(fused)
    assert len(p.applied) == 6
    assert sum(n.op_type == "Pad" for n in out.graph.node) >= 12
    y, _ = _session(out, data)
    assert float(np.abs(y - data["last_hidden_state"]).max()) < 1e-4


def test_int64_to_int32_on_minilm(minilm):
    model, data = minilm
    p = Pass.get_pass("int64_to_int32")
    out = p(model)
    assert {"input_ids", "attention_mask"} <= set(p.applied)
    assert all(vi.type.tensor_type.elem_type == onnx.TensorProto.INT32 for vi in out.graph.input)
    gathers = [n for n in out.graph.node if n.op_type == "Gather" and n.input[1] == "input_ids"]
    assert gathers, "the embedding lookup reads the int32 ids directly"
    feeds = {"input_ids": data["input_ids"].astype(np.int32), "attention_mask": data["attention_mask"].astype(np.int32)}
    y = _ort(out, feeds)[0]
    assert float(np.abs(y - data["last_hidden_state"]).max()) < 1e-4


def test_remove_initializer_from_input_on_a_light_model():
    m = runner.randomize_constant_weights(onnx.load(str(runner.resolve_model("light_squeezenet"))), seed=0)
    inits = {t.name for t in m.graph.initializer}
    assert sum(vi.name in inits for vi in m.graph.input) > 10
    p = Pass.get_pass("remove_initializer_from_input")
    out = p(m)
    assert len(p.applied) > 10 and not any(vi.name in inits for vi in out.graph.input)
    onnx.checker.check_model(out)
    feeds = runner.random_inputs(out, seed=0)
    np.testing.assert_allclose(_ort(out, feeds)[0], _ort(m, feeds)[0], rtol=1e-5, atol=1e-6)


def test_layer_norm_pattern_on_an_old_opset_gives_the_graphcore_op():
    rng = np.random.default_rng(0)
    g = oh.make_graph([], "ln", [oh.make_tensor_value_info("x", 1, [4, 8])], [oh.make_tensor_value_info("y", 1, [4, 8])])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    m.graph.initializer.extend([numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "gamma"),
                                numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta"),
                                numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                                numpy_helper.from_array(np.array(1e-5, np.float32), "eps")])
    m.graph.node.extend([oh.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), oh.make_node("Sub", ["x", "m"], ["d"]),
                         oh.make_node("Pow", ["d", "two"], ["s"]), oh.make_node("ReduceMean", ["s"], ["v"], axes=[-1]),
                         oh.make_node("Add", ["v", "eps"], ["ve"]), oh.make_node("Sqrt", ["ve"], ["sd"]),
                         oh.make_node("Div", ["d", "sd"], ["n"]), oh.make_node("Mul", ["n", "gamma"], ["sc"]),
                         oh.make_node("Add", ["sc", "beta"], ["y"])])
    p = Pass.get_pass("layer_norm_pattern")
    out = p(m)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("ai.graphcore", "LayerNorm")]
    x = rng.standard_normal([4, 8]).astype(np.float32)
    import popart
    s = popart.InferenceSession(fnModel=out.SerializeToString(), dataFlow=popart.DataFlow(1, {"y": popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, a))
    np.testing.assert_allclose(a["y"], _ort(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


# -- converter options ------------------------------------------------------------------------
def test_converter_fp16_with_skipped_op_types_and_input_shape_on_a_light_model():
    m = runner.randomize_constant_weights(onnx.load(str(runner.resolve_model("light_squeezenet"))), seed=0)
    name = [vi.name for vi in m.graph.input if vi.name not in {t.name for t in m.graph.initializer}][0]
    conv = poprt.Converter(precision="fp16", fp16_skip_op_types="Softmax", input_shape={name: [2, 3, 224, 224]})
    out = conv.convert(m)
    vi = [v for v in out.graph.input if v.name == name][0]
    assert vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert [d.dim_value for d in vi.type.tensor_type.shape.dim] == [2, 3, 224, 224]
    sm = [n for n in out.graph.node if n.op_type == "Softmax"]
    assert sm and all(GraphView(out.graph).prod(n.input[0], "Cast") is not None for n in sm)
    x = np.random.default_rng(0).standard_normal([2, 3, 224, 224]).astype(np.float32)
    ref = _ort(poprt.Converter(input_shape={name: [2, 3, 224, 224]}).convert(m), {name: x})[0]
    y = _ort(out, {name: x.astype(np.float16)})[0].astype(np.float32)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def test_converter_convert_version_and_bad_options():
    m = onnx.load(str(runner.resolve_model("light_squeezenet")))
    out = poprt.Converter(convert_version=13).convert(m)
    assert [o.version for o in out.opset_import if o.domain in ("", "ai.onnx")] == [13]
    with pytest.raises(ConverterError, match="needs an IPU with fp8"):
        poprt.Converter(precision="fp8", ipu_version="ipu2")
    with pytest.raises(ConverterError, match="precision must be one of"):
        poprt.Converter(precision="int4")
    with pytest.raises(ConverterError, match="unknown option"):
        poprt.Converter(precison="fp16")
    with pytest.raises(ConverterError, match="unknown fp8 format"):
        poprt.Converter(precision="fp8", fp8_params="F161,F143,0,0")
    with pytest.raises(ConverterError, match="no input"):
        poprt.Converter(input_shape={"nope": [1]}).convert(m)
