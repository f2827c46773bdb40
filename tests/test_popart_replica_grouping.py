"""Replica-grouped variables (``popart.VariableSettings``, PopART's ``variablesettings.rst``):
per-group initial values, the weightsToHost / readWeights shapes of each retrieval mode,
writeWeights with grouped values, gradients reduced within the groups (checked against each
group's training computed by hand in torch), on the IR executor and the device path."""

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import popart
from popart import CommGroup, CommGroupType, VariableRetrievalMode, VariableSettings

R = 4


def _opts(replicas=R, accumulation=1, mean=False):
    o = popart.SessionOptions()
    if mean:
        o.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    o.enableReplicatedGraphs = replicas > 1
    o.replicatedGraphCount = replicas
    if accumulation > 1:
        o.enableGradientAccumulation = True
        o.accumulationFactor = accumulation
    return o


def _dev(replicas=R):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas})


# -- the settings themselves ------------------------------------------------------------------
@pytest.mark.parametrize("gtype,size,groups", [
    (CommGroupType.All, 0, [[0, 1, 2, 3, 4, 5, 6, 7]]),
    (CommGroupType.Consecutive, 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (CommGroupType.Orthogonal, 4, [[0, 2, 4, 6], [1, 3, 5, 7]]),
    (CommGroupType.Orthogonal, 2, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (CommGroupType.Ungrouped, 0, [[i] for i in range(8)]),
])
def test_groups_follow_popart(gtype, size, groups):
    vs = VariableSettings(CommGroup(gtype, size), VariableRetrievalMode.OnePerGroup)
    assert vs.groups(8) == groups
    assert vs.getGroupCount(8) == len(groups)
    assert vs.getRealGroupSize(8) == len(groups[0])
    assert [vs.getGroupRepresentative(g) for g in range(len(groups))] == [m[0] for m in groups]
    assert vs.numReplicasReturningVariable(8) == len(groups)
    every = VariableSettings(CommGroup(gtype, size), VariableRetrievalMode.AllReplicas)
    assert every.numReplicasReturningVariable(8) == 8
    assert vs.shapeOnHost([3, 5], 8) == ([len(groups), 3, 5] if len(groups) > 1 else [3, 5])


def test_bad_group_size_is_popart_error():
    with pytest.raises(popart.popart_exception, match="VariableSettings had 1 errors"):
        VariableSettings(CommGroup(CommGroupType.Consecutive, 0), VariableRetrievalMode.OnePerGroup)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    w = b.addInitializedInputTensor(np.ones([3], np.float32),
                                    VariableSettings(CommGroup(CommGroupType.Consecutive, 3),
                                                     VariableRetrievalMode.OnePerGroup), "w")
    y = b.aiOnnx.mul([x, w])
    with pytest.raises(popart.popart_exception, match="divisible by the product of the stride and the group size"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), _dev(),
                                userOptions=_opts())


def test_leading_dimension_must_be_the_group_count():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    w = b.addInitializedInputTensor(np.ones([3, 3], np.float32),     # 3 values, but 2 groups
                                    VariableSettings(CommGroup(CommGroupType.Consecutive, 2),
                                                     VariableRetrievalMode.OnePerGroup), "w")
    y = b.aiOnnx.mul([x, w])
    with pytest.raises(popart.popart_exception, match=r"Incorrect size of tensor w\. Tensor shape at index 0 \(3\) "
                                                      r"should be == group_size = 2"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), _dev(),
                                userOptions=_opts())


# -- inference: the doc's example, run ----------------------------------------------------------
def test_grouped_inference_and_read_back(execution_mode):
    """``docs/popart/files/replication_popart.py``'s buffers: OnePerGroup returns [groups, ...],
    AllReplicas [replicas, ...]; each replica computes with its group's value."""
    base = [3, 5]
    group = CommGroup(CommGroupType.Consecutive, 2)
    one = VariableSettings(group, VariableRetrievalMode.OnePerGroup)
    every = VariableSettings(group, VariableRetrievalMode.AllReplicas)
    n = one.getGroupCount(R)
    init = np.arange(n * 15, dtype=np.float32).reshape([n] + base)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    a = b.addInitializedInputTensor(init, one)
    c = b.addInitializedInputTensor(init * 2, every)
    y = b.aiOnnx.add([b.aiOnnx.matmul([x, a]), b.aiOnnx.matmul([x, c])])
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), _dev(),
                                userOptions=_opts())
    s.prepareDevice()
    s.weightsFromHost()
    out = s.initAnchorArrays()
    xs = np.random.default_rng(0).random((R, 2, 3), np.float32)
    s.run(popart.PyStepIO({x: xs}, out))
    for r in range(R):
        np.testing.assert_allclose(out[y][r], xs[r] @ (3 * init[r // 2]), rtol=1e-5)
    buf_a = np.zeros([one.numReplicasReturningVariable(R)] + base, np.float32)
    buf_c = np.zeros([every.numReplicasReturningVariable(R)] + base, np.float32)
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO({a: buf_a, c: buf_c}))
    np.testing.assert_array_equal(buf_a, init)
    np.testing.assert_array_equal(buf_c, 2 * init[[0, 0, 1, 1]])
    # writeWeights with new grouped values reaches each group's replicas
    s.writeWeights(popart.PyWeightsIO({a: -init, c: np.zeros_like(init)}))
    s.run(popart.PyStepIO({x: xs}, out))
    for r in range(R):
        np.testing.assert_allclose(out[y][r], xs[r] @ -init[r // 2], rtol=1e-5)


# -- training: each group trains on its replicas' data -------------------------------------------
def _train(gtype, size, optimizer, accumulation, steps=2, model_file=None, mean=False):
    vs = VariableSettings(CommGroup(gtype, size), VariableRetrievalMode.OnePerGroup)
    n = vs.getGroupCount(R)
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal([n, 4, 3] if n > 1 else [4, 3]).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
    w = b.addInitializedInputTensor(w0, vs, "w")
    y = b.aiOnnx.matmul([x, w])
    loss = b.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               optimizer, _dev(), userOptions=_opts(accumulation=accumulation, mean=mean))
    s.prepareDevice()
    s.weightsFromHost()
    xs = rng.standard_normal([steps, accumulation, R, 2, 4]).astype(np.float32)
    for i in range(steps):
        data = xs[i] if accumulation > 1 else xs[i, 0]
        s.run(popart.PyStepIO({x: data}, s.initAnchorArrays()))
    s.weightsToHost()
    got = np.zeros_like(w0)
    s.readWeights(popart.PyWeightsIO({w: got}))
    if model_file is not None:
        s.modelToHost(str(model_file))
    return w0, xs, vs.groups(R), got


def _torch_reference(w0, xs, groups, make_opt, scale=1.0):
    """Each group: one weight, its replicas' gradients summed (times ``scale``), the optimizer
    stepped by hand."""
    out = []
    stack = w0 if w0.ndim == 3 else w0[None]
    for g, members in enumerate(groups):
        wt = torch.tensor(stack[g], requires_grad=True)
        opt = make_opt([wt])
        for i in range(xs.shape[0]):
            opt.zero_grad()
            loss = scale * sum((torch.tensor(xs[i, m, r]) @ wt).abs().sum() for m in range(xs.shape[1])
                               for r in members)
            loss.backward()
            opt.step()
        out.append(wt.detach().numpy())
    return np.stack(out) if w0.ndim == 3 else out[0]


GROUPINGS = [(CommGroupType.Consecutive, 2), (CommGroupType.Orthogonal, 2), (CommGroupType.Ungrouped, 0),
             (CommGroupType.All, 0)]


@pytest.mark.parametrize("gtype,size", GROUPINGS)
def test_grouped_sgd_equals_per_group_training(execution_mode, gtype, size):
    w0, xs, groups, got = _train(gtype, size, popart.SGD({"defaultLearningRate": (0.1, False)}), 1)
    ref = _torch_reference(w0, xs, groups, lambda p: torch.optim.SGD(p, lr=0.1))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gtype,size", GROUPINGS[:2])
def test_grouped_momentum_with_accumulation(execution_mode, gtype, size):
    """SGD with momentum and gradient accumulation: the accumulator's in-place all-reduce stays in
    the group, and the velocity is grouped like the weight."""
    opt = popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, False)})
    w0, xs, groups, got = _train(gtype, size, opt, 2)
    ref = _torch_reference(w0, xs, groups, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_mean_reduction_is_the_mean_over_every_replica(execution_mode, accumulation):
    """ReductionType.Mean (Post): a grouped weight's update is the gradient of the mean of every
    replica's loss (the group's gradients summed, divided by the replication factor and the
    micro-batches), with momentum (SGD1: the velocity all-reduced within the group)."""
    opt = popart.SGD({"defaultLearningRate": (0.2, False), "defaultMomentum": (0.9, False)})
    w0, xs, groups, got = _train(CommGroupType.Consecutive, 2, opt, accumulation, mean=True)
    ref = _torch_reference(w0, xs, groups, lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
                           scale=1.0 / (R * accumulation))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_paths_agree_and_model_to_host_keeps_groups(tmp_path, monkeypatch):
    """The IR executor and the device path give the same grouped weights, and modelToHost writes
    the [groups, *shape] value a new session starts from."""
    got = {}
    for mode in ("ir", "device"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        # Adam with a non-const learning rate (isConst False): the grouped weight's own scalars
        got[mode] = _train(CommGroupType.Orthogonal, 2, popart.Adam({"defaultLearningRate": (0.01, False)}), 1,
                           model_file=tmp_path / f"{mode}.onnx")[3]
    np.testing.assert_allclose(got["ir"], got["device"], rtol=1e-6, atol=1e-6)
    assert not np.allclose(got["ir"][0], got["ir"][1])
    m = onnx.load(str(tmp_path / "ir.onnx"))
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    np.testing.assert_allclose(init["w"], got["ir"], rtol=1e-6)
    assert init["Accl1___w"].shape == (2, 4, 3)          # Adam's moments, one per group
    # a new session starts from the file's grouped values
    s = popart.InferenceSession(m.SerializeToString(), popart.DataFlow(1, {"w": popart.AnchorReturnType("All")}),
                                _dev(), userOptions=_opts())
    s.prepareDevice()
    s.weightsFromHost()
    back = np.zeros_like(got["ir"])
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO({"w": back}))
    np.testing.assert_array_equal(back, got["ir"])


def test_sgd_const_values_per_group(execution_mode):
    """Const SGD values (baked into the update ops) count the group's replicas too."""
    opt = popart.SGD({"defaultLearningRate": (0.1, True), "defaultMomentum": (0.5, True)})
    w0, xs, groups, got = _train(CommGroupType.Orthogonal, 2, opt, 2)
    ref = _torch_reference(w0, xs, groups, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_builder_all_reduce_within_comm_groups(execution_mode):
    """``aiGraphcore.replicatedallreduce(args, commGroup=CommGroup(...))`` reduces within groups."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    cases = {None: [1111] * 4, CommGroup(CommGroupType.Consecutive, 2): [11, 11, 1100, 1100],
             CommGroup(CommGroupType.Orthogonal, 2): [101, 1010, 101, 1010],
             CommGroup(CommGroupType.Ungrouped, 0): [1, 10, 100, 1000]}
    outs = {b.aiGraphcore.replicatedallreduce([x], commGroup=cg): want for cg, want in cases.items()}
    s = popart.InferenceSession(b.getModelProto(),
                                popart.DataFlow(1, {t: popart.AnchorReturnType("All") for t in outs}), _dev(),
                                userOptions=_opts())
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.array([[1, 0], [10, 0], [100, 0], [1000, 0]], np.float32)}, a))
    for t, want in outs.items():
        assert a[t][:, 0].tolist() == want
