"""PopART's checks at PopART's moment (issue 35): invalid attributes raise
``popart.popart_exception`` with PopART's wording when the session is created (PopART sets up
every op in the session constructor), and the errors PopART raises at ``prepareDevice`` /
``run`` (no engine, wrong stepio sizes or types, anchors asked for but not given) are raised
there. Each row: how the model is built, where the error comes, and the message."""

from __future__ import annotations

import numpy as np
import pytest

import popart

ALL = popart.AnchorReturnType("All")


def _dev():
    return popart.DeviceManager().createIpuModelDevice({})


def _c(b, v):
    return b.aiOnnx.constant(np.asarray(v))


#: name -> (build(b, x) -> output id, opset, message regex); x is a FLOAT [2, 3] input
SESSION_ERRORS = {
    "reducesum_axis_too_big": (lambda b, x: b.aiOnnx.reducesum([x], axes=[5]), 10,
                               r"Cannot compute ReduceOp on axis 5 when input rank is 2, invalid ReduceOp "
                               r"\d+ \(ai.onnx.ReduceSum:1\)\."),
    "reducemean_axis_too_small": (lambda b, x: b.aiOnnx.reducemean([x], axes=[-3]), 11,
                                  r"Cannot compute ReduceOp on axis -1 when input rank is 2, invalid ReduceOp "
                                  r"\d+ \(ai.onnx.ReduceMean:11\)\."),
    "reducesum_opset13_axes_input": (lambda b, x: b.aiOnnx.reducesum([x, _c(b, np.array([2], np.int64))]), 13,
                                     r"Cannot compute ReduceOp on axis 2 when input rank is 2"),
    "reducemax_opset18_axes_input": (lambda b, x: b.aiOnnx.reducemax([x, _c(b, np.array([-4], np.int64))]), 18,
                                     r"Cannot compute ReduceOp on axis -2 when input rank is 2"),
    "reducemedian": (lambda b, x: b.aiGraphcore.reducemedian([x], axes=[3])[0], 11,
                     r"Cannot compute ReduceOp on axis 3 when input rank is 2, invalid ReduceOp "
                     r"\d+ \(ai.graphcore.ReduceMedian:1\)"),
    "argmax_axis": (lambda b, x: b.aiOnnx.argmax([x], axis=2), 11,
                    r"Cannot compute ArgExtremaOp on axis 2 when input rank is 2, invalid ArgExtremaOp"),
    "argmin_axis_negative": (lambda b, x: b.aiOnnx.argmin([x], axis=-3), 11,
                             r"Axis -3 is out of acceptable range \[-2, 1\]"),
    "softmax_axis": (lambda b, x: b.aiOnnx.softmax([x], axis=2), 10,
                     r"Softmax axis, 2, is outside of acceptable range \[-2, 1\]"),
    "logsoftmax_axis": (lambda b, x: b.aiOnnx.logsoftmax([x], axis=-3), 11,
                        r"LogSoftmax axis, -3, is outside of acceptable range \[-2, 1\]"),
    "concat_axis": (lambda b, x: b.aiOnnx.concat([x, x], axis=2), 11,
                    r"Attribute 'axis' of ConcatOp, 2, is outside of acceptable range \[-2, 1\]"),
    "gather_axis": (lambda b, x: b.aiOnnx.gather([x, _c(b, np.array([0], np.int32))], axis=-3), 11,
                    r"GatherOp::setup axis = -3 is outside the acceptable range \[-2, 1\]"),
    "split_axis": (lambda b, x: b.aiOnnx.split([x], 2, axis=2)[0], 11,
                   r"Axis 2 is out of range for tensor with 2 dims"),
    "split_sizes": (lambda b, x: b.aiOnnx.split([x], 2, axis=1, split=[1, 1])[0], 11,
                    r"splits 2 invalid for dimension of size 3"),
    "transpose_perm_rank": (lambda b, x: b.aiOnnx.transpose([x], perm=[0, 1, 2]), 11,
                            r"Rank of permutation tensor \[0 1 2\], rank 3 must be equal to rank of input tensor, "
                            r"shape \[2 3\], rank 2\."),
    "transpose_perm_repeated": (lambda b, x: b.aiOnnx.transpose([x], perm=[1, 1]), 11,
                                r"Permutation \[1 1\] of Op .* is not a permutation"),
    "topk_k_too_big": (lambda b, x: b.aiOnnx.topk([x, _c(b, np.array([4], np.int64))], axis=1)[0], 11,
                       r"Cannot take top-4 on dim of size 3, invalid Op \d+ \(ai.onnx.TopK:11\)"),
    "topk_k_negative": (lambda b, x: b.aiOnnx.topk([x, _c(b, np.array([-1], np.int64))], axis=1)[0], 11,
                        r"Cannot take top-k with k = -1"),
    "flatten_axis": (lambda b, x: b.aiOnnx.flatten([x], axis=3), 11,
                     r"Flatten axis, 3, is outside of acceptable range \[-2, 2\]"),
    "squeeze_not_one": (lambda b, x: b.aiOnnx.squeeze([x], axes=[1]), 11, r"Cannot squeeze axis 1 of size 3"),
    "unsqueeze_repeated": (lambda b, x: b.aiOnnx.unsqueeze([x], axes=[0, 0]), 11, r"Unsqueeze axes \[0 0\] are not "
                                                                                  r"unique"),
    "reshape_below_minus_one": (lambda b, x: b.aiOnnx.reshape([x, _c(b, np.array([-2, 3], np.int64))]), 11,
                                r"Dimension, -2, of new shape for Reshape cannot be smaller than -1\."),
    "reshape_two_unknown": (lambda b, x: b.aiOnnx.reshape([x, _c(b, np.array([-1, -1], np.int64))]), 11,
                            r"shape input to ReshapeOp can only use -1 to specify one unknown dimension"),
    "tile_negative": (lambda b, x: b.aiOnnx.tile([x, _c(b, np.array([1, -2], np.int64))]), 11,
                      r"Tile repeats \[1 -2\] .* must not be negative"),
    "dynamicslice_negative_size": (lambda b, x: b.aiGraphcore.dynamicslice(
        [x, _c(b, np.array([0], np.uint32))], axes=[0], sizes=[-1]), 11, r"DynamicSlice sizes \[-1\] .* must not be "
                                                                          r"negative"),
    "cumsum_axis": (lambda b, x: b.aiOnnx.cumsum([x, _c(b, np.array(2, np.int32))]), 11,
                    r"CumSum axis 2 is outside of acceptable range \[-2, 1\]"),
    "sqrt_of_int": (lambda b, x: b.aiOnnx.sqrt([b.aiOnnx.cast([x], "INT32")]), 11,
                    r"Op \d+ \(ai.onnx.Sqrt:6\) does not take input 0 of type INT32"),
    "gelu_of_int": (lambda b, x: b.aiGraphcore.gelu([b.aiOnnx.cast([x], "INT32")]), 11,
                    r"Op \d+ \(ai.graphcore.Gelu:1\) does not take input 0 of type INT32"),
    "randomnormal_int_dtype": (lambda b, x: b.aiOnnx.add([x, b.aiOnnx.randomnormal(shape=[2, 3], dtype=6)]), 11,
                               r"ai.onnx.RandomNormal:1 : Unsupported data type requested: INT32"),
    "randomuniformlike_bool_dtype": (lambda b, x: b.aiOnnx.randomuniformlike([x], dtype=9), 11,
                                     r"ai.onnx.RandomUniformLike:1 : Unsupported data type requested: BOOL"),
}


@pytest.mark.parametrize("name", sorted(SESSION_ERRORS))
@pytest.mark.parametrize("training", [False, True])
def test_invalid_attribute_raises_at_session_creation(name, training):
    build, opset, msg = SESSION_ERRORS[name]
    b = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    y = build(b, x)       # the Builder accepts it, as PopART's does
    if training:
        w = b.addInitializedInputTensor(np.ones((2, 3), np.float32))
        loss = b.aiGraphcore.l1loss([b.aiOnnx.mul([x, w])], 0.1)
        with pytest.raises(popart.popart_exception, match=msg):
            popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {y: ALL, loss: ALL}), loss,
                                   popart.ConstSGD(0.1), _dev())
    else:
        with pytest.raises(popart.popart_exception, match=msg):
            popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev())


def test_valid_edge_attributes_pass():
    """The edges of each range are accepted (negative axes, k equal to the dim, Flatten axis = rank)."""
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    outs = [b.aiOnnx.reducesum([x], axes=[-2]), b.aiOnnx.softmax([x], axis=-2), b.aiOnnx.argmax([x], axis=-1),
            b.aiOnnx.concat([x, x], axis=-1), b.aiOnnx.flatten([x], axis=2), b.aiOnnx.flatten([x], axis=-2),
            b.aiOnnx.topk([x, _c(b, np.array([3], np.int64))], axis=-1)[0], b.aiOnnx.transpose([x], perm=[1, 0]),
            b.aiOnnx.unsqueeze([x], axes=[-1, 0]), b.aiOnnx.reshape([x, _c(b, np.array([-1], np.int64))])]
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {o: ALL for o in outs}), _dev())
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.arange(6, dtype=np.float32).reshape(2, 3)}, a))
    assert a[outs[4]].shape == (6, 1) and a[outs[5]].shape == (1, 6)


def test_virtual_graph_on_some_ops_only():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    with b.virtualGraph(0):
        y = b.aiOnnx.relu([x])
    z = b.aiOnnx.exp([y])
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    with pytest.raises(popart.popart_exception, match="Either all Ops must have their virtual graph ids set, or none "
                                                      "must"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {z: ALL}), _dev(), userOptions=opts)


def _session(training=False):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInitializedInputTensor(np.ones(3, np.float32))
    y = b.aiOnnx.add([x, w])
    if training:
        loss = b.aiGraphcore.l1loss([y], 0.1)
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {y: ALL}), loss, popart.ConstSGD(0.1),
                                   _dev())
    else:
        s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(2, {y: ALL}), _dev())
    return s, x, y


X = np.ones((2, 2, 3), np.float32)


@pytest.mark.parametrize("call", ["run", "weightsFromHost", "weightsToHost"])
def test_no_engine_before_prepare_device(call):
    s, x, y = _session(training=True)
    fn = {"run": lambda: s.run(popart.PyStepIO({x: X}, s.initAnchorArrays())), "weightsFromHost": s.weightsFromHost,
          "weightsToHost": s.weightsToHost}[call]
    with pytest.raises(popart.popart_exception, match=r"There is no executatable\. Try calling "
                                                      r"Session::prepareDevice first\."):
        fn()


RUN_ERRORS = {
    "input_too_small": (lambda s, x, y: popart.PyStepIO({x: X[:1]}, s.initAnchorArrays()),
                        r"Unexpected number of input elements for Tensor input\. Expected 12, but received 6\.\n"
                        r"To disable this check at your own risk, use IStepIO::enableRuntimeAsserts\."),
    "output_wrong_size": (lambda s, x, y: popart.PyStepIO({x: X}, {y: np.zeros(5, np.float32)}),
                          r"Unexpected number of output elements for Tensor Add:0\. Expected 12, but received 5\."),
    "input_missing": (lambda s, x, y: popart.PyStepIO({}, s.initAnchorArrays()),
                      r"No tensor input provided in PyStepIO's inputs"),
    "anchor_not_given": (lambda s, x, y: popart.PyStepIO({x: X}, {}),
                         r"No tensor Add:0 provided in PyStepIO's outputs"),
    "input_unknown": (lambda s, x, y: popart.PyStepIO({x: X, "nope": X}, s.initAnchorArrays()),
                      r"there is no Tensor named nope in the Ir's main Graph"),
    "input_wrong_type": (lambda s, x, y: popart.PyStepIO({x: X.astype(np.float16)}, s.initAnchorArrays()),
                         r"Type discrepancy for tensor input\. User provided : FLOAT16 and expected : FLOAT\."),
}


@pytest.mark.parametrize("name", sorted(RUN_ERRORS))
def test_stepio_errors_at_run(name):
    s, x, y = _session()
    s.prepareDevice()
    io = RUN_ERRORS[name][0](s, x, y)
    with pytest.raises(popart.popart_exception, match=RUN_ERRORS[name][1]):
        s.run(io)


def test_training_run_before_weights_from_host():
    s, x, y = _session(training=True)
    s.prepareDevice()
    with pytest.raises(popart.popart_exception, match="Must call weightsFromHost before run as the model has "
                                                      "initializers and the session has been created in training mode"):
        s.run(popart.PyStepIO({x: X}, s.initAnchorArrays()))


def test_session_creation_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    y = b.aiOnnx.relu([x])
    with pytest.raises(popart.popart_exception, match="User must specify an anchor tensor when doing inference."):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {}), _dev())
    with pytest.raises(popart.popart_exception, match=r"Loss tensor, 'Relu:0', must be a scalar tensor"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), y, popart.ConstSGD(0.1), _dev())
    with pytest.raises(popart.popart_exception, match="Could not find loss tensor 'nope' in main graph tensors"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), "nope", popart.ConstSGD(0.1), _dev())


MIXED = {
    "add": (lambda b, x, h: b.aiOnnx.add([x, h]), r"np broadcasting failed on Op \d+ \(ai.onnx.Add:7\), incompatible "
                                                  r"types FLOAT and FLOAT16 \(shapes \[2 3\] and \[2 3\]\)"),
    "mul_tensors": (lambda b, x, h: b.aiOnnx.mul([h, x]), r"incompatible types FLOAT16 and FLOAT"),
    "sum": (lambda b, x, h: b.aiOnnx.sum([x, h]), r"on Op \d+ \(ai.onnx.Sum:8\), incompatible types"),
    "where": (lambda b, x, h: b.aiOnnx.where([b.aiOnnx.greater([x, x]), x, h]), r"\(ai.onnx.Where:9\), incompatible"),
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_mixed_float_types_refused(name):
    """PopART's ``npOut`` type check: elementwise ops take one element type."""
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    h = b.addInputTensor(popart.TensorInfo("FLOAT16", [2, 3]))
    y = MIXED[name][0](b, x, h)
    with pytest.raises(popart.popart_exception, match=MIXED[name][1]):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev())


@pytest.mark.parametrize("name", ["reducesum_axis_too_big", "softmax_axis", "transpose_perm_rank", "topk_k_too_big"])
def test_check_graph_gives_the_session_error(name):
    """``op_setup.check_graph`` (for callers that check before strict ONNX inference) raises the
    error the session raises."""
    import onnx

    from openipu.popart import op_setup
    build, opset, msg = SESSION_ERRORS[name]
    b = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    build(b, x)
    m = onnx.load_from_string(b.getModelProto())
    inferred = onnx.shape_inference.infer_shapes(m)
    shapes = {vi.name: (onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type),
                        [d.dim_value for d in vi.type.tensor_type.shape.dim])
              for vi in list(inferred.graph.input) + list(inferred.graph.value_info)}
    with pytest.raises(popart.popart_exception, match=msg.replace(r"\d+ ", r"\d+ ")):
        op_setup.check_graph(m, shapes)
