"""Behaviours published PopART programs rely on (issue 35, measured on a corpus of public PopART
scripts): a device-acquisition retry loop that replaces ``DeviceManager.acquireAvailableDevice``,
a one-element loss of any rank, ``syntheticDataMode`` not reading the stepio's buffers, and the
pre-SDK-2.1 ``debugPrefix`` keyword of the builder ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart

ALL = popart.AnchorReturnType("All")


def _dev():
    return popart.DeviceManager().createIpuModelDevice({})


# -- DeviceManager: acquire / tryAcquire do not call each other --------------------------------
def test_try_acquire_inside_a_replaced_acquire_does_not_recurse(monkeypatch):
    calls = []

    def patient_acquire(*args, **kwargs):           # the retry loop scripts install
        calls.append(args)
        d = popart.DeviceManager.tryAcquireAvailableDevice(*args, **kwargs)
        if d is None:
            raise RuntimeError("no device")
        return d

    monkeypatch.setattr(popart.DeviceManager, "acquireAvailableDevice", patient_acquire)
    d = popart.DeviceManager().acquireAvailableDevice(2)
    assert d.numIpus == 2 and len(calls) == 1
    # a request that cannot be met: tryAcquire gives None, acquire raises
    assert popart.DeviceManager().tryAcquireAvailableDevice(3) is None
    monkeypatch.undo()
    with pytest.raises(popart.popart_exception, match="power of two"):
        popart.DeviceManager().acquireAvailableDevice(3)


def test_try_acquire_device_by_id_with_replaced_acquire(monkeypatch):
    monkeypatch.setattr(popart.DeviceManager, "acquireDeviceById",
                        lambda self, i, *a: popart.DeviceManager.tryAcquireDeviceById(self, i, *a))
    assert popart.DeviceManager().acquireDeviceById(3).id == 3


# -- the final loss: one element, any rank (PopART checks nelms() > 1) -------------------------
def _sum_square_model(keepdims):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w0 = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    w = b.addInitializedInputTensor(w0)
    d = b.aiOnnx.sub([b.aiOnnx.mul([x, w]), x])
    loss = b.aiOnnx.reducesumsquare([d], keepdims=keepdims)
    return b, x, w, w0, loss


def test_rank2_one_element_loss_trains_like_torch():
    b, x, w, w0, loss = _sum_square_model(keepdims=1)
    assert b.getTensorShape(loss) == [1, 1]
    g = popart.reservedGradientPrefix() + w
    s = popart.TrainingSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {loss: ALL, g: ALL}),
                               loss=loss, optimizer=popart.ConstSGD(0.1), deviceInfo=_dev())
    s.prepareDevice()
    s.weightsFromHost()
    anchors = s.initAnchorArrays()
    xv = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    s.run(popart.PyStepIO({x: xv}, anchors))

    tw = torch.tensor(w0, requires_grad=True)
    tl = ((torch.tensor(xv) * tw - torch.tensor(xv)) ** 2).sum()
    tl.backward()
    np.testing.assert_allclose(anchors[loss].reshape(()), tl.item(), rtol=1e-5)
    np.testing.assert_allclose(anchors[g], tw.grad.numpy(), rtol=1e-5)
    out = {w: np.zeros_like(w0)}
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_allclose(out[w], w0 - 0.1 * tw.grad.numpy(), rtol=1e-5)


def test_loss_of_several_elements_is_refused():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInitializedInputTensor(np.ones([2, 3], np.float32))
    loss = b.aiOnnx.reducesumsquare([b.aiOnnx.mul([x, w])], axes=[1], keepdims=1)     # [2, 1]
    with pytest.raises(popart.popart_exception, match=f"Loss tensor, '{loss}', must be a scalar tensor"):
        popart.TrainingSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {loss: ALL}), loss=loss,
                               optimizer=popart.ConstSGD(0.1), deviceInfo=_dev())


# -- syntheticDataMode: the stepio's input buffers are not read --------------------------------
def _fp16_session(mode):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [2, 2]))
    y = b.aiOnnx.add([x, x])
    opts = popart.SessionOptions()
    opts.syntheticDataMode = mode
    s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {y: ALL}),
                                userOptions=opts, deviceInfo=_dev())
    s.prepareDevice()
    return s, x, y


def test_synthetic_data_ignores_the_input_buffer_type():
    s, x, y = _fp16_session(popart.SyntheticDataMode.Zeros)
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.full([2, 2], 7, np.int32)}, anchors))     # wrong type: never read
    assert anchors[y].dtype == np.float16
    # the element count is still checked
    with pytest.raises(popart.popart_runtime_error):
        s.run(popart.PyStepIO({x: np.zeros([3, 2], np.float16)}, anchors))


def test_real_data_checks_the_input_buffer_type():
    s, x, y = _fp16_session(popart.SyntheticDataMode.Off)
    anchors = s.initAnchorArrays()
    with pytest.raises(popart.popart_exception, match="Type discrepancy for tensor .* User provided : INT32 and "
                                                      "expected : FLOAT16"):
        s.run(popart.PyStepIO({x: np.full([2, 2], 7, np.int32)}, anchors))
    s.run(popart.PyStepIO({x: np.full([2, 2], 3, np.float16)}, anchors))
    np.testing.assert_array_equal(anchors[y], np.full([2, 2], 6, np.float16))


# -- debugPrefix, the builder ops' keyword before debugContext ---------------------------------
def test_debug_prefix_is_debug_context():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), debugPrefix="xin")
    w = b.addInitializedInputTensor(np.ones([3, 2], np.float32), debugPrefix="w")
    assert (x, w) == ("xin", "w")
    y = b.aiOnnx.matmul([x, w], debugPrefix="mm")
    p = b.aiOnnx.softmax([y], axis=1, debugPrefix="sm")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [2]))
    nll = b.aiGraphcore.nllloss([p, lab], popart.ReductionType.Sum, debugPrefix="nll")
    names = {n.op_type: n.name for n in __import__("onnx").load_from_string(b.getModelProto()).graph.node}
    assert names["MatMul"] == "mm" and names["Softmax"] == "sm" and names["Nll"] == "nll"
    with pytest.raises(TypeError, match="both 'debugPrefix' and 'debugContext'"):
        b.aiOnnx.relu([x], debugPrefix="a", debugContext="b")
    with pytest.raises(TypeError, match="both 'debugPrefix' and 'debugContext'"):
        b.aiGraphcore.gelu([x], debugPrefix="a", debugContext="b")
    with pytest.raises(TypeError):
        b.aiOnnx.relu([x], debugPrefx="typo")
    assert b.getTensorShape(nll) == []
