"""The Builder writes valid ONNX (issue 35): every ``value_info`` it adds has an element type and
a full shape, so models with multi-output ops (5-output BatchNormalization, TopK, Split, LSTM,
Dropout's mask, MaxPool's indices) and ai.graphcore ops pass ``onnx.checker`` with
``full_check=True`` (strict shape inference included)."""

from __future__ import annotations

import numpy as np
import onnx

import popart


def _check(b):
    m = onnx.load_from_string(b.getModelProto())
    onnx.checker.check_model(m, full_check=True)
    for vi in list(m.graph.value_info) + list(m.graph.output):
        t = vi.type.tensor_type
        assert t.elem_type != 0, vi.name
        assert t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim), vi.name
    return m


def test_multi_output_onnx_ops_pass_the_full_checker():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 4, 4]), "x")
    s = b.addInitializedInputTensor(np.ones(3, np.float32))
    bias = b.addInitializedInputTensor(np.zeros(3, np.float32))
    m = b.addInitializedInputTensor(np.zeros(3, np.float32))
    v = b.addInitializedInputTensor(np.ones(3, np.float32))
    outs = b.aiOnnx.batchnormalization([x, s, bias, m, v], 5, epsilon=1e-5, momentum=0.9)
    assert len(outs) == 5
    vals, idx = b.aiOnnx.topk([outs[0], b.aiOnnx.constant(np.array([2], np.int64))], axis=3)
    parts = b.aiOnnx.split([vals], 2, axis=1, split=[1, 2])
    pooled, where = b.aiOnnx.maxpool([x], 2, [2, 2], strides=[2, 2])
    seq = b.addInputTensor(popart.TensorInfo("FLOAT", [5, 2, 4]), "seq")
    w = b.addInitializedInputTensor(np.ones((1, 12, 4), np.float32))
    r = b.addInitializedInputTensor(np.ones((1, 12, 3), np.float32))
    lstm = b.aiOnnx.lstm([seq, w, r], 3)
    for t in [*outs, idx, *parts, pooled, where, *lstm]:
        b.addOutputTensor(t)
    m = _check(b)
    assert len(m.graph.output) == 5 + 1 + 2 + 2 + 3


def test_dropout_mask_and_graphcore_ops_pass_the_full_checker():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 6]), "x")
    y, mask = b.aiOnnx.dropout([x], 2, 0.3)
    g = b.aiGraphcore.groupnormalization([b.aiOnnx.reshape([y, b.aiOnnx.constant(np.array([4, 6, 1, 1], np.int64))]),
                                          b.aiOnnx.constant(np.ones(6, np.float32)),
                                          b.aiOnnx.constant(np.zeros(6, np.float32))], 2)
    z = b.aiGraphcore.scale([x], 2.0)
    for t in [y, mask, *g, z]:
        b.addOutputTensor(t)
    m = _check(b)
    types = {o.name: o.type.tensor_type.elem_type for o in m.graph.output}
    assert types[mask] == onnx.TensorProto.BOOL
