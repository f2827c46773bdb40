"""PopART's collectives within replica groups: ``aiGraphcore.replicatedreducescatter`` with a
``commGroup`` (PopART's ``ReplicatedReduceScatterOp``: the comm group's size sets the piece
size), the deprecated ``replicatedallreduce(args, [type, size])`` form, and the optimizer state
of replica-grouped weights under replicated tensor sharding, against numpy and torch references,
on the IR executor and the device path."""

import numpy as np
import pytest

import popart
from popart import CommGroup, CommGroupType

R = 4


def _opts(replicas=R):
    o = popart.SessionOptions()
    o.enableReplicatedGraphs = replicas > 1
    o.replicatedGraphCount = replicas
    return o


def _dev(replicas=R):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas})


def _groups(cg: CommGroup | None, replicas: int = R) -> list[list[int]]:
    """The replica groups of ``cg``, written out independently of openipu's code."""
    if cg is None or str(cg.type) == "All":
        return [list(range(replicas))]
    k = cg.replicaGroupSize
    if str(cg.type) == "Consecutive":
        return [list(range(g * k, (g + 1) * k)) for g in range(replicas // k)]
    if str(cg.type) == "Orthogonal":
        stride = replicas // k
        return [list(range(g, replicas, stride)) for g in range(stride)]
    return [[r] for r in range(replicas)]


def _scatter_reference(xs: np.ndarray, cg, op=np.sum) -> np.ndarray:
    """``[replicas, k]``: each group's inputs reduced, padded and cut in pieces, in group order."""
    out = {}
    for members in _groups(cg):
        p = len(members)
        red = op(xs[members].reshape(p, -1), axis=0)
        k = -(-red.size // p)
        padded = np.zeros(p * k, xs.dtype)
        padded[:red.size] = red
        for q, r in enumerate(members):
            out[r] = padded[q * k:(q + 1) * k]
    return np.stack([out[r] for r in range(len(xs))])


CASES = [None, CommGroup(CommGroupType.All, 0), CommGroup(CommGroupType.Consecutive, 2),
         CommGroup(CommGroupType.Orthogonal, 2), CommGroup(CommGroupType.Consecutive, 4),
         CommGroup(CommGroupType.Ungrouped, 0)]


def test_reduce_scatter_within_comm_groups(execution_mode):
    """Each comm group type against the numpy reference per group: the output's size is
    ``ceil(n / group size)`` (7 elements: 2 pieces of 4 (padded), 4 of 2, 1 of 7)."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [7]), "x")
    outs = [b.aiGraphcore.replicatedreducescatter([x], commGroup=cg) for cg in CASES]
    mx = b.aiGraphcore.replicatedreducescatter([x], popart.CollectiveOperator.Max,
                                               CommGroup(CommGroupType.Orthogonal, 2))
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {t: popart.AnchorReturnType("All")
                                                                        for t in outs + [mx]}),
                                _dev(), userOptions=_opts())
    s.prepareDevice()
    a = s.initAnchorArrays()
    xs = np.random.default_rng(0).standard_normal((R, 7)).astype(np.float32)
    s.run(popart.PyStepIO({x: xs}, a))
    for t, cg in zip(outs, CASES):
        want = _scatter_reference(xs, cg)
        assert list(a[t].shape) == list(want.shape), (cg, a[t].shape)
        np.testing.assert_allclose(a[t], want, rtol=1e-6, atol=1e-6, err_msg=str(cg))
    np.testing.assert_array_equal(a[mx], _scatter_reference(xs, CommGroup(CommGroupType.Orthogonal, 2), np.max))


def test_reduce_scatter_shape_is_the_comm_groups(execution_mode):
    """The session infers ``[ceil(n / group size)]`` (PopART's ``ReplicatedReduceScatterOp::setup``);
    a group size that does not divide the replicas is a ``popart_exception`` when the session
    is made."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 5]), "x")
    y = b.aiGraphcore.replicatedreducescatter([x], commGroup=CommGroup(CommGroupType.Consecutive, 2))
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                _dev(), userOptions=_opts())
    assert s.getInfo(y).shape() == [5]
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [6]), "x")
    y = b.aiGraphcore.replicatedreducescatter([x], commGroup=CommGroup(CommGroupType.Consecutive, 3))
    with pytest.raises(popart.popart_exception, match="does not divide"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                _dev(), userOptions=_opts())


def test_comm_group_must_be_a_comm_group():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4]), "x")
    with pytest.raises(popart.popart_exception, match="commGroup must be a popart.CommGroup"):
        b.aiGraphcore.replicatedreducescatter([x], commGroup=[1, 2])


def test_deprecated_all_reduce_with_a_comm_group_list(execution_mode):
    """PopART's deprecated ``replicatedallreduce(args, commGroup: [type, size])``."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1]), "x")
    y = b.aiGraphcore.replicatedallreduce([x], [1, 2])
    z = b.aiGraphcore.replicatedallreduce([x], [2, 2])
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {t: popart.AnchorReturnType("All")
                                                                        for t in (y, z)}),
                                _dev(), userOptions=_opts())
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.array([[1], [10], [100], [1000]], np.float32)}, a))
    assert a[y][:, 0].tolist() == [11, 11, 1100, 1100]
    assert a[z][:, 0].tolist() == [101, 1010, 101, 1010]


# -- replicated tensor sharding of a replica-grouped weight's optimizer state -------------------
def _grouped_training(vs, optimizer, rts, domain=None, accumulation=1, steps=2, model=None, model_file=None,
                      replicas=R):
    """Train ``w`` (grouped by ``vs``) with ``optimizer``; returns (session, initializers of its
    ``modelToHost`` file, the initial grouped value)."""
    n = vs.getGroupCount(replicas)
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal([n, 4, 3] if n > 1 else [4, 3]).astype(np.float32)
    if model is None:
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
        w = b.addInitializedInputTensor(w0, vs, "w")
        y = b.aiOnnx.matmul([x, w])
        loss = b.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
        model = b.getModelProto()
    else:
        x, loss = "x", "L1:0"
    o = _opts(replicas)
    if accumulation > 1:
        o.enableGradientAccumulation, o.accumulationFactor = True, accumulation
    if rts:
        loc = o.optimizerStateTensorLocationSettings
        loc.location = popart.TensorLocation(popart.TensorStorage.OnChip, popart.ReplicatedTensorSharding.On,
                                             domain) if domain is not None else \
            popart.TensorLocation(popart.TensorStorage.OnChip, popart.ReplicatedTensorSharding.On)
        loc.minElementsForReplicatedTensorSharding = 4
    s = popart.TrainingSession(model, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               optimizer, _dev(replicas), userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    xs = np.random.default_rng(4).standard_normal([steps, accumulation, replicas, 2, 4]).astype(np.float32)
    for i in range(steps):
        s.run(popart.PyStepIO({x: xs[i] if accumulation > 1 else xs[i, 0]}, s.initAnchorArrays()))
    import onnx
    from onnx import numpy_helper
    s.modelToHost(str(model_file))
    m = onnx.load(str(model_file))
    return s, {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}, m


GROUPED = [(CommGroupType.Consecutive, 2, "adam", 1), (CommGroupType.Orthogonal, 2, "adam", 2),
           (CommGroupType.Orthogonal, 2, "sgd2", 2), (CommGroupType.Consecutive, 2, "lamb", 1)]


def _optimizer(kind):
    return {"adam": lambda: popart.Adam({"defaultLearningRate": (0.01, False)}),
            "lamb": lambda: popart.Adam({"defaultLearningRate": (0.01, True)}, mode=popart.AdamMode.Lamb),
            "sgd2": lambda: popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)},
                                       accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate)}[kind]()


@pytest.mark.parametrize("gtype,size,kind,af", GROUPED, ids=[f"{g}-{k}-af{a}" for g, _, k, a in GROUPED])
def test_grouped_weight_state_sharded_within_its_groups(gtype, size, kind, af, tmp_path):
    """``shardingDomain`` equal to the weight's ``sharedVariableDomain``: each group's state is
    sharded over the group's replicas (reduce-scatter, slice, all-gather within the group; state
    ``[ceil(12 / 2)]`` per replica); weights and state (``modelToHost``, ``[groups, 4, 3]``)
    equal the unsharded run's."""
    cg = CommGroup(gtype, size)
    vs = popart.VariableSettings(cg, popart.VariableRetrievalMode.OnePerGroup)
    got = {}
    for rts in (False, True):
        s, got[rts], _ = _grouped_training(vs, _optimizer(kind), rts, cg if rts else None, af,
                                           model_file=tmp_path / f"{rts}.onnx")
        if rts:
            sharded = s.getIr().sharded_state
            assert sharded and all(s.getIr().tensors[t].info.shape() == [6] for t in sharded)
            ops = [op for op in s.ops() if op.op_type in ("ReplicatedReduceScatter", "ReplicatedAllGather",
                                                          "ReplicaSlice")]
            assert len(ops) == 3 and all(op.attrs.get("commGroup") for op in ops)
    assert set(got[True]) == set(got[False]) and got[True]["w"].shape == (2, 4, 3)
    for k, v in got[False].items():
        np.testing.assert_allclose(got[True][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert not np.allclose(got[True]["w"][0], got[True]["w"][1])


@pytest.mark.parametrize("rts", [False, True])
def test_grouped_state_resumes_from_model_to_host(tmp_path, rts):
    """Train 1 step, ``modelToHost``, a new TrainingSession from the file trains 1 more: the same
    weights and Adam moments (``[groups, 4, 3]`` in the file) as 2 steps in one session (state
    grouped, and sharded within the groups with ``rts``)."""
    cg = CommGroup(CommGroupType.Orthogonal, 2)
    vs = popart.VariableSettings(cg, popart.VariableRetrievalMode.OnePerGroup)
    _, two, _ = _grouped_training(vs, _optimizer("adam"), rts, cg, steps=2, model_file=tmp_path / "two.onnx")
    _, _, m = _grouped_training(vs, _optimizer("adam"), rts, cg, steps=1, model_file=tmp_path / "one.onnx")
    assert two["Accl1___w"].shape == (2, 4, 3)
    # the second session's step sees the second batch
    _, resumed, _ = _resume(vs, m, tmp_path, rts)
    for k, v in two.items():
        np.testing.assert_allclose(resumed[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def _resume(vs, m, tmp_path, rts=True):
    """One step from model ``m`` on the second batch of :func:`_grouped_training`'s data."""
    cg = vs.getSharedVariableDomain()
    o = _opts()
    if rts:
        loc = o.optimizerStateTensorLocationSettings
        loc.location = popart.TensorLocation(popart.TensorStorage.OnChip, popart.ReplicatedTensorSharding.On, cg)
        loc.minElementsForReplicatedTensorSharding = 4
    loss = [n.output[0] for n in m.graph.node][-1]
    s = popart.TrainingSession(m.SerializeToString(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                               loss, _optimizer("adam"), _dev(), userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    xs = np.random.default_rng(4).standard_normal([2, 1, R, 2, 4]).astype(np.float32)
    s.run(popart.PyStepIO({"x": xs[1, 0]}, s.initAnchorArrays()))
    import onnx
    from onnx import numpy_helper
    s.modelToHost(str(tmp_path / "resumed.onnx"))
    return s, {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "resumed.onnx")).graph.initializer}, m


def test_grouped_weight_with_the_default_sharding_domain_is_popart_error(tmp_path):
    """PopART cannot shard a grouped weight's state over all replicas (its groups hold different
    values): ``popart_internal_exception`` naming both groupings, when the session is made."""
    vs = popart.VariableSettings(CommGroup(CommGroupType.Consecutive, 2), popart.VariableRetrievalMode.OnePerGroup)
    with pytest.raises(popart.popart_internal_exception,
                       match=r"Could not return a supported ReplicaGrouping transpose of "
                             r"ReplicaGrouping\(numReplicas=4, stride=1, groupSize=4\) within the super-set: "
                             r"ReplicaGrouping\(numReplicas=4, stride=1, groupSize=2\)"):
        _grouped_training(vs, _optimizer("adam"), True, model_file=tmp_path / "x.onnx")


def test_ungrouped_weight_state_is_not_sharded(tmp_path):
    """``CommGroupType.None`` (each replica its own value): PopART turns sharding off for it."""
    vs = popart.VariableSettings(CommGroup(CommGroupType.Ungrouped, 0), popart.VariableRetrievalMode.OnePerGroup)
    s, rts, _ = _grouped_training(vs, _optimizer("adam"), True, model_file=tmp_path / "a.onnx")
    assert not s.getIr().sharded_state
    _, plain, _ = _grouped_training(vs, _optimizer("adam"), False, model_file=tmp_path / "b.onnx")
    for k, v in plain.items():
        np.testing.assert_allclose(rts[k], v, rtol=1e-6, err_msg=k)


def test_tensor_location_constructors():
    cg = CommGroup(CommGroupType.Consecutive, 2)
    loc = popart.TensorLocation(popart.TensorStorage.OffChip, popart.ReplicatedTensorSharding.On, cg)
    assert loc.storage == popart.TensorStorage.OffChip and loc.shardingDomain == cg
    assert str(loc.replicatedTensorSharding).endswith("On")
    loc = popart.TensorLocation(popart.TensorStorage.OnChip, popart.ReplicatedTensorSharding.On)
    assert str(loc.replicatedTensorSharding).endswith("On") and loc.shardingDomain is None


def test_embed_replication_factor_and_reset_grouped_host_weights(execution_mode):
    """``embedReplicationFactor`` writes PopART's ``__replicationFactor`` metadata;
    ``resetHostWeights`` takes a grouped weight's ``[groups, *shape]`` initializer (each group
    its value after ``weightsFromHost``) and refuses other shapes and types with PopART's
    ``runtime_error``."""
    import onnx
    from onnx import numpy_helper
    vs = popart.VariableSettings(CommGroup(CommGroupType.Consecutive, 2), popart.VariableRetrievalMode.OnePerGroup)
    w0 = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    b = popart.Builder()
    b.embedReplicationFactor(R)
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 4]), "x")
    w = b.addInitializedInputTensor(w0, vs, "w")
    y = b.aiOnnx.matmul([x, w])
    proto = b.getModelProto()
    meta = {p.key: p.value for p in onnx.load_from_string(proto).metadata_props}
    assert meta["__replicationFactor"] == "4"
    o = _opts()
    o.constantWeights = False
    s = popart.InferenceSession(proto, popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), _dev(),
                                userOptions=o)
    s.prepareDevice()
    m = onnx.load_from_string(proto)
    new = -w0
    for init in m.graph.initializer:
        if init.name == w:
            init.CopyFrom(numpy_helper.from_array(new, w))
    s.resetHostWeights(m.SerializeToString())
    s.weightsFromHost()
    a = s.initAnchorArrays()
    xs = np.ones((R, 1, 4), np.float32)
    s.run(popart.PyStepIO({x: xs}, a))
    want = np.stack([xs[r] @ new[r // 2] for r in range(R)])
    np.testing.assert_allclose(a[y], want, rtol=1e-6)
    for bad in (new[0], new.astype(np.float16)):
        for init in m.graph.initializer:
            if init.name == w:
                init.CopyFrom(numpy_helper.from_array(bad, w))
        with pytest.raises(popart.popart_runtime_error, match="non matching tensor info. Tensor ID: " + w):
            s.resetHostWeights(m.SerializeToString())


@pytest.mark.parametrize("domain", [CommGroup(CommGroupType.Consecutive, 2), CommGroup(CommGroupType.Orthogonal, 2)])
def test_sharding_domain_of_an_ungrouped_weight(domain, tmp_path):
    """An ordinary weight with ``shardingDomain`` a group of 2 of the 4 replicas: its Adam state
    is sharded 2 ways (``[6]`` per replica), the pieces reduce-scattered within the domain and
    summed across the complementary groups (PopART's AllReduceToScatter); weights and state
    equal the unsharded run's (to float32 summation order)."""
    vs = popart.VariableSettings(CommGroup(CommGroupType.All, 0), popart.VariableRetrievalMode.OnePerGroup)
    got = {}
    for rts in (False, True):
        s, got[rts], _ = _grouped_training(vs, _optimizer("adam"), rts, domain if rts else None, 2,
                                           model_file=tmp_path / f"{rts}.onnx")
        if rts:
            assert s.getIr().sharded_state and all(s.getIr().tensors[t].info.shape() == [6]
                                                   for t in s.getIr().sharded_state)
            reduces = [op for op in s.ops() if op.op_type == "ReplicatedAllReduce" and op.attrs.get("commGroup")]
            assert len(reduces) == 1
    # the sums run in another order (within the domain, then across): float32 rounding of
    # gradients that nearly cancel differs by up to ~1e-5 relative in Adam's second moment
    for k, v in got[False].items():
        np.testing.assert_allclose(got[True][k], v, rtol=1e-4, atol=1e-6, err_msg=k)
