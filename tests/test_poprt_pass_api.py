"""PopRT's pass API as clients use it (PopRT 1.4 user guide, "Python API"; the call sites of Byte
MLPerf's IPU backend, written here from its documented behaviour, not its code): the pass base
classes and name lookup (``poprt.passes.base_pass``), the helpers (``onnx_helper``,
``pattern_helper``, ``shape_inference``), ``remove_duplicated_initializer``, ``apply_ir_pass`` /
``unique_name_for_nodes``, ``final_check``, ``sort_graph``, ``remove_input_cast``, the passes with no
meaning on the simulator, ``insert_attention_mask`` on unfused attention, ``poprt.__version__``."""

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import poprt
import poprt.passes.base_pass as base_pass
from poprt.passes import Pass, register
from poprt.passes.apply_ir_pass import ApplyIrPass
from poprt.passes.onnx_helper import clean_info, get_dtype, get_shape, topological_sort
from poprt.passes.pattern_helper import PatternMatcher
from poprt.passes.remove_duplicated_initializer import RemoveDuplicatedInitializer
from poprt.passes.shape_inference import infer_shapes

F = TensorProto.FLOAT


def _ort(model, feeds, names=None):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(names, feeds)


def _chain(opset=13):
    """x -> Relu -> Add(b) -> Mul(c) -> y, with two equal initializers b, c."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "b"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "c"], ["y"], name="mul")]
    inits = [numpy_helper.from_array(np.full(4, 2.0, np.float32), "b"),
             numpy_helper.from_array(np.full(4, 2.0, np.float32), "c")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 4])],
                          [helper.make_tensor_value_info("y", F, [2, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


# -- version and module identity ---------------------------------------------------------------------
def test_version_and_drop_in_submodules_are_openipus_modules():
    import openipu.poprt.passes.base_pass as impl
    assert isinstance(poprt.__version__, str) and poprt.__version__.startswith("1.4")
    assert base_pass is impl                       # one module object: assignments are seen by openipu
    import importlib
    assert importlib.import_module("poprt.passes.onnx_helper").clean_info is clean_info
    assert importlib.import_module("poprt.passes.shape_inference") is importlib.import_module(
        "openipu.poprt.passes.shape_inference")


# -- base classes and name lookup ----------------------------------------------------------------------
def test_register_sets_name_and_lookup_goes_through_base_pass_at_call_time(monkeypatch):
    assert not hasattr(Pass, "name")               # the base has no name: subclasses inherit none
    assert issubclass(base_pass.ImmutablePass, Pass)

    @register("api_test_pass")
    class Mine(Pass):
        def run(self, model):
            return model
    assert Mine.name == "api_test_pass"
    assert base_pass.get_all_named_subclasses(Pass)["api_test_pass"] is Mine
    assert isinstance(Pass.get_pass("api_test_pass"), Mine)

    class Child(Mine):                             # inherits a name: does not take it over
        pass
    assert base_pass.get_all_named_subclasses(Pass)["api_test_pass"] is Mine

    class Check(base_pass.ImmutablePass):          # a class attribute name, no @register
        name = "api_test_check"

        def run(self, model):
            return model
    assert base_pass.get_all_named_subclasses(Pass)["api_test_check"] is Check

    # a client replacing the lookup (Byte MLPerf does, to swap final_check) is obeyed by the converter
    ran = []

    class MyFinal(base_pass.ImmutablePass):
        def run(self, model):
            ran.append(len(model.graph.node))
            return model
    orig = base_pass.get_all_named_subclasses

    def patched(cls):
        d = orig(cls)
        d["final_check"] = MyFinal
        return d
    monkeypatch.setattr(base_pass, "get_all_named_subclasses", patched)
    out = poprt.Converter().convert(_chain())
    assert ran == [3] and len(out.graph.node) == 3


def test_pass_logger_and_call_returns_a_copy():
    p = poprt.Pass.get_pass("sort_graph")
    assert p.logger.name == "poprt.passes.sort_graph"
    m = _chain()
    out = p(m)
    assert out is not m and [n.name for n in out.graph.node] == ["relu", "add", "mul"]


def test_traverse_graph_visits_subgraphs_then_main_and_uses_the_results():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [2])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "main",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    seen = []

    def transform(graph, is_main_graph):
        seen.append((graph.name, is_main_graph))
        new = onnx.GraphProto()
        new.CopyFrom(graph)
        new.doc_string = "visited"
        return new
    out = Pass.traverse_graph(g, transform)
    assert sorted(seen[:2]) == [("else", False), ("then", False)] and seen[2] == ("main", True)
    assert out.doc_string == "visited"
    assert all(a.g.doc_string == "visited" for a in g.node[0].attribute)


# -- onnx_helper ---------------------------------------------------------------------------------------
def test_clean_info_get_dtype_get_shape_topological_sort():
    m = _chain()
    m.graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.INT32, [9]))   # stale
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    m = clean_info(m)
    onnx.checker.check_model(m)
    assert get_shape(m.graph, "y") == [2, 4]          # a symbolic output dimension inferred again
    assert get_dtype(m.graph, "r") == F and get_shape(m.graph, "r") == [2, 4]
    assert get_dtype(m.graph, "b") == F and get_shape(m.graph, "b") == [4]
    with pytest.raises(KeyError):
        get_dtype(m.graph, "nope")
    shuffled = onnx.GraphProto()
    shuffled.CopyFrom(m.graph)
    nodes = list(shuffled.node)
    del shuffled.node[:]
    shuffled.node.extend([nodes[2], nodes[0], nodes[1]])
    assert [n.name for n in topological_sort(shuffled)] == ["relu", "add", "mul"]
    shuffled.node[1].input[0] = "y"                  # relu reads mul's output: a cycle
    with pytest.raises(ValueError, match="cycle"):
        topological_sort(shuffled)


# -- pattern_helper ------------------------------------------------------------------------------------
def test_pattern_matcher_chains_branches_and_iteration():
    m = _chain()
    pm = PatternMatcher(["s:0->Relu:relu->Add:1->Mul:mul->e:1"])
    ops = pm.next_pattern(m.graph)
    assert {k: (v.node.name, v.index) for k, v in ops.items()} == {"relu": ("relu", 0), "1": ("add", 1),
                                                                   "mul": ("mul", 2)}
    assert pm.next_pattern(m.graph) is None           # no second, different match
    # a branch: the Add reads the Relu, and so does a second op
    m.graph.node.append(helper.make_node("Sigmoid", ["r"], ["s"], name="sig"))
    pm2 = PatternMatcher(["Relu:r -> Add:a", "   Relu:r->Sigmoid:s   "])
    assert pm2.next_pattern(m.graph)["s"].node.name == "sig"
    assert PatternMatcher(["Relu:r->Mul:m"]).next_pattern(m.graph) is None    # Mul does not read Relu
    with pytest.raises(ValueError):
        PatternMatcher(["Relu->Add:a"])
    with pytest.raises(ValueError):
        PatternMatcher(["Relu:x->Add:x"])


# -- shape inference -----------------------------------------------------------------------------------
def test_infer_shapes_tolerates_graphcore_ops():
    g = helper.make_graph([helper.make_node("AttentionMask", ["m", "s"], ["am"], domain="ai.graphcore",
                                            dataType="FLOAT"),
                           helper.make_node("Add", ["am", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("m", TensorProto.INT32, [2, 8]),
                           helper.make_tensor_value_info("s", F, [2, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.graphcore", 1)])
    out = infer_shapes(m)
    assert get_shape(out.graph, "am") == [2, 4, 8, 8] and get_shape(out.graph, "y") == [2, 4, 8, 8]
    assert len(m.graph.value_info) == 0              # the input model is not modified


# -- remove_duplicated_initializer, apply_ir_pass, unique_name_for_nodes ---------------------------------
def test_remove_duplicated_initializer_merges_equal_weights():
    m = _chain()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    want = _ort(m, {"x": x})[0]
    out = RemoveDuplicatedInitializer().run(m)
    assert [t.name for t in out.graph.initializer] == ["b"] and list(out.graph.node[2].input) == ["a", "b"]
    np.testing.assert_array_equal(_ort(out, {"x": x})[0], want)


def test_apply_ir_pass_unique_names_and_ir_only_names_logged_once(caplog):
    m = _chain()
    m.graph.node[1].name = "relu"                    # a repeat
    m.graph.node[2].name = ""                        # none
    with caplog.at_level(logging.INFO, logger="poprt.passes.apply_ir_pass"):
        out = ApplyIrPass(["unique_name_for_nodes", "api_test_ir_only"])(m)
        ApplyIrPass(["api_test_ir_only"])(m)
    names = [n.name for n in out.graph.node]
    assert len(set(names)) == 3 and all(names) and names[0] == "relu"
    assert sum("api_test_ir_only" in r.message for r in caplog.records) == 1


def test_final_check_warns_without_changing_the_model(caplog):
    m = _chain()
    m.graph.node.append(helper.make_node("Identity", ["y"], ["dangling"]))
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with caplog.at_level(logging.WARNING, logger="poprt.passes.final_check"):
        out = Pass.get_pass("final_check")(m)
    assert out.SerializeToString() == m.SerializeToString()
    assert out.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"


# -- graph order / input casts -----------------------------------------------------------------------------
def test_remove_input_cast_and_sort_graph():
    nodes = [helper.make_node("Add", ["xf", "xf"], ["y"], name="add"),
             helper.make_node("Cast", ["x"], ["xf"], name="cast", to=F)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3])],
                          [helper.make_tensor_value_info("y", F, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    m = Pass.get_pass("sort_graph")(m)
    assert [n.name for n in m.graph.node] == ["cast", "add"]
    out = Pass.get_pass("remove_input_cast")(m)
    assert out.graph.input[0].type.tensor_type.elem_type == F and [n.op_type for n in out.graph.node] == ["Add"]
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(_ort(out, {"x": x})[0], 2 * x)


# -- passes with no meaning on the simulator --------------------------------------------------------------
@pytest.mark.parametrize("name", ["disable_fast_norm", "replace_groupnorm_with_fast_norm", "matmul_rotary_embedding",
                                  "auto_insert_remap"])
def test_simulator_no_op_passes_are_accepted_and_log_once(name, caplog):
    m = _chain()
    with caplog.at_level(logging.INFO, logger="poprt.passes"):
        a = Pass.get_pass(name)(m)
        Pass.get_pass(name)(m)
    assert a.SerializeToString() == m.SerializeToString()
    assert sum(name in r.message for r in caplog.records) <= 1


def test_converter_takes_byte_mlperfs_options():
    conv = poprt.Converter(input_shape={"x": [2, 4]}, precision="", disable_fast_norm=True, enable_insert_remap=True,
                           remap_mode=["after_matmul", " before_add"], max_tensor_size=6291456, infer_shape_ahead=True,
                           used_passes=["disable_fast_norm", "replace_groupnorm_with_fast_norm"])
    out = conv.convert(_chain())
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(_ort(out, {"x": x})[0], _ort(_chain(), {"x": x})[0])


# -- insert_attention_mask on attention left as ops (BERT as exported, opset 11) ---------------------------
def _attention(opset):
    """softmax(q k^T + (1 - mask) * -10000) v, one head: q = k = v = x [1, 1, S, D]; mask [1, S] int64."""
    mk = helper.make_node
    axes = {"axes": [1, 2]} if opset < 13 else {}
    ax_in = ["ax1"] if opset >= 13 else []
    nodes = [mk("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]), mk("MatMul", ["x", "xt"], ["sc"]),
             mk("Unsqueeze", ["mask"] + ax_in, ["m3"], **axes), mk("Cast", ["m3"], ["mf"], to=F),
             mk("Sub", ["one", "mf"], ["inv"]), mk("Mul", ["inv", "neg"], ["bias"]),
             mk("Add", ["sc", "bias"], ["z"]), mk("Softmax", ["z"], ["p"], axis=-1), mk("MatMul", ["p", "x"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-10000.0, np.float32), "neg")]
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "ax1"))
    S, D = 8, 4
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", F, [1, 1, S, D]),
                                          helper.make_tensor_value_info("mask", TensorProto.INT64, [1, S])],
                          [helper.make_tensor_value_info("y", F, [1, 1, S, D])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [11, 13])
def test_insert_attention_mask_on_unfused_attention_keeps_packed_sequences_apart(opset):
    m = _attention(opset)
    out = Pass.get_pass("insert_attention_mask")(m)
    onnx.checker.check_model(out)
    assert not any(n.op_type == "Sub" for n in out.graph.node)     # BERT's own mask arithmetic is gone
    rng = np.random.default_rng(opset)
    x = rng.standard_normal((1, 1, 8, 4)).astype(np.float32)
    seg = np.array([[1, 1, 1, 2, 2, 2, 2, 0]], np.int64)             # two sequences packed, one pad
    got = _ort(out, {"x": x, "mask": seg})[0]
    for k, (a, b) in enumerate(((0, 3), (3, 7))):
        alone = np.zeros_like(x)
        alone[0, 0, :b - a] = x[0, 0, a:b]
        mask = np.zeros((1, 8), np.int64)
        mask[0, :b - a] = 1
        want = _ort(m, {"x": alone, "mask": mask})[0][0, 0, :b - a]
        np.testing.assert_allclose(got[0, 0, a:b], want, rtol=1e-5, atol=1e-5)
    unmasked = _ort(m, {"x": x, "mask": (seg > 0).astype(np.int64)})[0]     # the model alone mixes them
    assert not np.allclose(unmasked[0, 0, :3], got[0, 0, :3], atol=1e-3)
