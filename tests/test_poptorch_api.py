"""PopTorch's API surface (``research/poptorch.md`` 1.3, 1.10): its ops (identity / plain PyTorch
on the CPU, PopART ops when compiled), and the ``PoplarExecutor`` members beyond running a
model (state, RNG, latencies, export / load)."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

import poptorch


def _nodes(pm):
    return list(onnx.load_from_string(pm._built.model).graph.node)


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return None


class Ops(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, i):
        y = poptorch.set_available_memory(self.fc(x), 0.3)
        y = poptorch.ipu_print_tensor(poptorch.nop(y), "why")
        with poptorch.NameScope("blk"), poptorch.Attribute(__outline={"layer": 1}):
            z = poptorch.dynamic_slice(y, 0, i, 2, 1)
        z = poptorch.dynamic_update(y, z * 2, 0, i + 1, 2)
        w = poptorch.serializedMatMul(z, self.fc.weight, poptorch.MatMulSerializationMode.OutputChannels, 2)
        return poptorch.recomputationCheckpoint(w)


def test_ops_match_the_cpu_and_lower_to_popart_ops(capfd):
    torch.manual_seed(0)
    m = Ops()
    x, i = torch.randn(4, 4), torch.tensor(1, dtype=torch.int32)
    ref = m(x, i)
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(x, i), ref, rtol=1e-5, atol=1e-6)
    assert "why: [" in capfd.readouterr().out             # printed at run time, as PopART does
    nodes = _nodes(pm)
    types = [n.op_type for n in nodes]
    for t in ("Nop", "PrintTensor", "DynamicSlice", "DynamicUpdate"):
        assert t in types
    matmuls = [n for n in nodes if n.op_type == "MatMul"]
    assert _attr(matmuls[0], "__available_memory_proportion") == pytest.approx(0.3)
    assert _attr(matmuls[-1], "__serialize_matmul_mode") == "output_channels"
    assert _attr(matmuls[-1], "__serialize_matmul_factor") == 2
    ds = next(n for n in nodes if n.op_type == "DynamicSlice")
    assert ds.name.startswith("blk/") and json.loads(_attr(ds, "__outline")) == {"layer": 1}
    assert _attr(nodes[-1], "__recompute_output_in_backward_pass") == "Checkpoint"


def test_dynamic_slice_trains_like_torch():
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, i):
            y = poptorch.dynamic_slice(poptorch.ipu_print_tensor(self.fc(x), print_gradient=False), 0, i, 2, 1)
            return y, poptorch.identity_loss(y.pow(2), "sum")
    m = M()
    ref = M()
    ref.load_state_dict(m.state_dict())
    x, i = torch.randn(4, 4), torch.tensor(2, dtype=torch.int32)
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    pm(x, i)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(x, i)[1].backward()
    opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_op_argument_errors():
    x = torch.randn(4, 3)
    with pytest.raises(poptorch.Error, match="only step 1"):
        poptorch.dynamic_slice(x, 0, torch.tensor(0), 2, 2)
    with pytest.raises(poptorch.Error, match="must match input"):
        poptorch.dynamic_update(x, torch.randn(2, 2), 0, torch.tensor(0), 2)
    with pytest.raises(poptorch.Error, match=r"must be in \(0, 1\]"):
        poptorch.set_available_memory(x, 1.5)
    with pytest.raises(poptorch.Error, match="lists must hold one type"):
        poptorch.custom_op([x], "Op", "my.ops", 1, [x], {"a": [1, "b"]})


class Flow(torch.nn.Module):
    def forward(self, x):
        c = poptorch.cond(x.sum() > 0, lambda a: a * 2, [x], lambda a: a - 1, [x])[0]
        return poptorch.for_loop(3, lambda a, b: (a + b, b), [c, x])[0]


def test_cond_and_for_loop_run_on_the_device():
    pm = poptorch.inferenceModel(Flow())
    for x in (torch.ones(2, 3), -torch.ones(2, 3)):
        torch.testing.assert_close(pm(x), Flow()(x))
    types = [n.op_type for n in _nodes(pm)]
    assert "If" in types and "Loop" in types
    with pytest.raises(poptorch.Error, match="inference models only"):
        class Train(Flow):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.ones(3))

            def forward(self, x):
                return poptorch.identity_loss(super().forward(x * self.w), "sum")
        poptorch.trainingModel(Train())(torch.ones(2, 3))
    with pytest.raises(poptorch.Error, match="as many tensors as it takes"):
        poptorch.for_loop(2, lambda a: (a, a), [torch.ones(1)])


def _cube(inputs, attributes):
    return [inputs[0] ** 3 * attributes["scale"]]


def test_custom_op_runs_its_python_kernel_and_trains():
    poptorch.register_custom_op("Cube", "test.ops", _cube)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((3,), 0.5))

        def forward(self, x):
            y = poptorch.custom_op([x * self.w], "Cube", "test.ops", 1, example_outputs=[x],
                                   attributes={"scale": 2.0})[0]
            return y, poptorch.identity_loss(y, "sum")
    m = M()
    x = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(m(x)[0], (x * 0.5) ** 3 * 2)
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.01))
    out, _ = pm(x)
    torch.testing.assert_close(out, (x * 0.5) ** 3 * 2)
    # d/dw sum(2 (x w)^3) = 6 x^3 w^2
    torch.testing.assert_close(m.w.detach(), 0.5 - 0.01 * 6 * x ** 3 * 0.25)
    with pytest.raises(poptorch.Error, match="has no kernel"):
        class Unknown(torch.nn.Module):
            def forward(self, x):
                return poptorch.custom_op([x], "Nope", "test.ops", 1, [x])[0]
        poptorch.inferenceModel(Unknown())(x)


def test_cpu_callback_runs_on_the_host():
    calls = []

    def host(x):
        calls.append(x.shape)
        return x.flip(-1) + 1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cb = poptorch.CPU(host, "flip")

        def forward(self, x):
            return self.cb(x * 2) * 3
    x = torch.arange(6.0).reshape(2, 3)
    out = poptorch.inferenceModel(M())(x)
    torch.testing.assert_close(out, ((x * 2).flip(-1) + 1) * 3)
    assert calls


def test_multiconv_records_its_options_on_each_convolution():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(2, 4, 3)
            self.b = torch.nn.Conv2d(2, 4, 3)

        def forward(self, x, y):
            with poptorch.MultiConv().availableMemoryProportions((0.2, 0.4)).partialsTypes(torch.half) \
                    .planType(poptorch.MultiConvPlanType.Serial):
                return self.a(x) + self.b(y)
    m = M()
    x, y = torch.randn(1, 2, 6, 6), torch.randn(1, 2, 6, 6)
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(x, y), m(x, y), rtol=1e-5, atol=1e-5)
    convs = [n for n in _nodes(pm) if n.op_type == "Conv"]
    assert [_attr(c, "__available_memory_proportion") for c in convs] == pytest.approx([0.2, 0.4])
    assert {_attr(c, "__partials_type") for c in convs} == {"HALF"}
    assert {_attr(c, "__multiconv_plan_type") for c in convs} == {"serial"}
