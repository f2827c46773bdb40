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


@pytest.fixture(params=["ir", "device"])
def path(request, monkeypatch):
    monkeypatch.setenv("OPENIPU_EXECUTION", request.param)
    return request.param


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


def test_reduce_scatter_within_comm_groups(path):
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


def test_reduce_scatter_shape_is_the_comm_groups(path):
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


def test_deprecated_all_reduce_with_a_comm_group_list(path):
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
