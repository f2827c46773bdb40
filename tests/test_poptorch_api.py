"""PopTorch's API surface (``research/poptorch.md`` 1.3, 1.10): its ops (identity / plain PyTorch
on the CPU, PopART ops when compiled), and the ``PoplarExecutor`` members beyond running a
model (state, RNG, latencies, export / load)."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

import poptorch

# compiles about a dozen models: kept out of `make test` (< 10 min), run by `make test-slow`
pytestmark = pytest.mark.slow


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


# -- PoplarExecutor -------------------------------------------------------------------------------
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x, y=None):
        out = self.fc2(self.drop(torch.relu(self.fc1(x))))
        return out if y is None else (out, torch.nn.functional.cross_entropy(out, y))


def _data(n=4):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_state_dict_rng_timings_and_backward_error():
    torch.manual_seed(0)
    m = Net().eval()
    x, _ = _data()
    pm = poptorch.inferenceModel(m, poptorch.Options().deviceIterations(2))
    assert not pm.isCompiled() and pm.getPerfCounters()["input"] == [[]]
    with pytest.raises(poptorch.Error, match="not been compiled"):
        pm.rng_state
    out = pm(x)
    assert pm.isCompiled() and pm.compilationTime() > 0
    other = Net().state_dict()
    pm.load_state_dict(other)                       # attached: the new weights reach the device
    torch.testing.assert_close(pm(x), m(x), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out, pm(x))
    pc = pm.getPerfCounters()
    assert len(pc["input"]) == 1 and len(pc["input"][0]) == 2 and len(pc["output"][0]) == 2
    for lat in (pm.getHostIpuLatency(), pm.getComputeLatency(), pm.getIpuHostLatency(), pm.getLatency()):
        assert len(lat) == 3 and 0 <= lat[0] <= lat[2] <= lat[1]
    with pytest.raises(poptorch.Error, match=r"backward\(\) cannot be called explicitly on outputs"):
        pm(x).backward()
    tm = poptorch.trainingModel(Net(), poptorch.Options().randomSeed(42))
    tm(*_data())
    assert tm.rng_state == [42]
    tm.rng_state = [7]
    assert tm.rng_state == [7]


def test_detach_then_call_reattaches():
    m = Net().eval()
    x, _ = _data()
    pm = poptorch.inferenceModel(m)
    ref = pm(x)
    pm.detachFromDevice()
    assert not pm.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        pm.detachFromDevice()
    torch.testing.assert_close(pm(x), ref)          # PopTorch attaches again on a call
    assert pm.isAttachedToDevice()


def test_wrapping_twice_for_training():
    m = Net()
    tm = poptorch.trainingModel(m)
    msg = r"Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy\(\) on the model"
    with pytest.raises(RuntimeError, match=msg):
        poptorch.trainingModel(m)
    poptorch.inferenceModel(m)                      # inference wrappers may share it
    m.destroy()
    tm2 = poptorch.trainingModel(m)
    tm2.destroy()
    poptorch.trainingModel(tm2)                      # a destroyed wrapper can be wrapped again
    assert tm is not None
    from poptorch import _impl
    _impl.unwrapModelIfNecessary(m)
    _impl.rewrapModelIfNecessary(m)


def test_save_and_load_without_pickle(tmp_path):
    torch.manual_seed(0)
    m = Net().eval()
    x, y = _data()
    opts = poptorch.Options().deviceIterations(2)
    pm = poptorch.inferenceModel(m, opts)
    path = str(tmp_path / "infer.poptorch")
    pm.compileAndExport(path, x)
    import zipfile
    with zipfile.ZipFile(path) as z:
        names = sorted(z.namelist())
        meta = json.loads(z.read("poptorch.json"))
    assert names == sorted(["executable.popef", "manifest.json", "model.onnx", "poptorch.json",
                            *[f"w{i}.npy" for i in range(len(meta["weight_ids"]))]])
    assert meta["format"] == "openipu.poptorch.executable" and meta["version"] == 2
    loaded = poptorch.load(path)
    assert loaded._loaded_executable                  # the saved executable, not a new compile
    torch.testing.assert_close(loaded(x), m(x), rtol=1e-5, atol=1e-6)
    assert loaded.options.device_iterations == 2
    edited = poptorch.load(path, lambda o: o.deviceIterations(4))
    assert edited.options.device_iterations == 4 and not edited._loaded_executable   # other options: compiled
    with pytest.raises(poptorch.Error, match="stores no Python code"):
        loaded.model(x)
    # loadExecutable: the wrapper's own model supplies the weights
    m2 = Net().eval()
    pm2 = poptorch.inferenceModel(m2, opts)
    pm2.loadExecutable(path)
    assert pm2._loaded_executable
    torch.testing.assert_close(pm2(x), m2(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(poptorch.Error, match="don't match the inputs used to compile"):
        pm2(torch.randn(6, 6))
    bad = tmp_path / "bad.poptorch"
    bad.write_bytes(b"\x80\x04K\x01.")              # a pickle: refused, never unpickled
    with pytest.raises(poptorch.Error, match="not an openipu PopTorch executable"):
        poptorch.load(str(bad))


def test_saved_training_model_keeps_training(tmp_path):
    torch.manual_seed(0)
    m = Net()
    m.drop.p = 0.0
    x, y = _data()
    tm = poptorch.trainingModel(m, optimizer=poptorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    tm(x, y)
    path = str(tmp_path / "train.poptorch")
    tm.save(path)
    ref = Net()
    ref.drop.p = 0.0
    ref.load_state_dict(m.state_dict())
    loaded = poptorch.load(path)
    assert isinstance(loaded._optimizer, poptorch.optim.SGD) and loaded._optimizer.param_groups[0]["momentum"] == 0.9
    _, loss = loaded(x, y)
    torch.testing.assert_close(loss.reshape(()), torch.nn.functional.cross_entropy(ref(x), y), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(loaded.model.fc1.weight, ref.fc1.weight)     # trained on


def test_recomputation_checkpoint_of_a_sequence():
    # Graphcore's GPT-2 checkpoints each element of a block's output, including the (key, value)
    # cache, through a forward hook: a single tuple / list is checkpointed element by element
    a, b = torch.ones(2), torch.zeros(3)
    kv = poptorch.recomputationCheckpoint((a, b))
    assert isinstance(kv, tuple) and len(kv) == 2 and torch.equal(kv[0], a) and torch.equal(kv[1], b)
    one = poptorch.recomputationCheckpoint([a])
    assert isinstance(one, list) and torch.equal(one[0], a)
    assert torch.equal(poptorch.recomputationCheckpoint(a), a)
    assert len(poptorch.recomputationCheckpoint(a, b)) == 2
    for bad in ((a, None), ((a, (a, b)),)):
        with pytest.raises(ValueError, match="All inputs must be tensors"):
            poptorch.recomputationCheckpoint(*bad)


def test_save_initializers_to_file(tmp_path):
    # PopTorch's own _Popart key (Graphcore's GPT-2 sets it): the weights go to the file in
    # PopART's external-data layout when the session is built, and the model still runs
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    opts = poptorch.Options()
    opts._Popart.set("saveInitializersToFile", str(tmp_path / "weights.bin"))
    pm = poptorch.inferenceModel(m, opts)
    x = torch.randn(4, 3)
    torch.testing.assert_close(pm(x), m(x), rtol=1e-5, atol=1e-6)
    data = (tmp_path / "weights.bin").read_bytes()
    want = {m.weight.detach().numpy().tobytes(), m.bias.detach().numpy().tobytes()}
    assert len(data) == sum(len(b) for b in want)
    assert all(b in data for b in want)
    assert [p.name for p in tmp_path.iterdir()] == ["weights.bin"]      # no temporary file left
    opts = poptorch.Options()
    opts._Popart.set("saveInitializersToFile", str(tmp_path / "missing" / "w.bin"))
    with pytest.raises(poptorch.Error, match="parent directory does not exist"):
        poptorch.inferenceModel(m, opts)(x)
