"""The IR executor's host threads (``openipu.popart.execute`` / ``execute_plan``): which
convolutions follow the host's load, the busy test, the check that a step's results do not
depend on its threads, and that a session's results are the same whichever way the load goes.
Host threading only: none of it changes an output or a prediction."""

import numpy as np
import pytest
import torch

import popart
from openipu.popart import execute, execute_plan
from test_ir_executor_steps import sgd_training


class _T:
    def __init__(self, shape, dtype="FLOAT"):
        self.info = type("I", (), {"shape": lambda _s, shape=shape: shape,
                                   "data_type": lambda _s, dtype=dtype: dtype})()


class _Op:
    def __init__(self, domain, op_type, ins, outs, attrs=None):
        self.domain, self.op_type, self.inputs, self.outputs, self.attrs = domain, op_type, ins, outs, attrs or {}


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_load_adaptive_convolutions_by_work_and_dtype():
    """Float32 convolutions and their gradients from HOST_ADAPTIVE_WORK up to HOST_PARALLEL_WORK
    multiply-accumulates may follow the load; smaller or larger ones, half ones, matmuls and
    elementwise ops do not."""
    ir = type("Ir", (), {})()
    ir.tensors = {"x": _T([4, 64, 16, 16]), "w": _T([64, 64, 3, 3]), "y": _T([4, 64, 16, 16]),
                  "xs": _T([4, 64, 4, 4]), "ys": _T([4, 64, 4, 4]), "xb": _T([16, 64, 32, 32]),
                  "yb": _T([16, 64, 32, 32]), "xh": _T([4, 64, 16, 16], "FLOAT16"),
                  "wh": _T([64, 64, 3, 3], "FLOAT16"), "yh": _T([4, 64, 16, 16], "FLOAT16"),
                  "a": _T([1024, 1024]), "b": _T([1024, 32])}
    assert execute_plan.load_adaptive(ir, _Op("", "Conv", ["x", "w"], ["y"]))                     # 37.7 M
    assert execute_plan.load_adaptive(ir, _Op("ai.graphcore", "ConvDataGrad", ["y", "w"], ["x"]))
    assert execute_plan.load_adaptive(ir, _Op("ai.graphcore", "ConvWeightsGrad", ["y", "x"], ["w"]))
    assert not execute_plan.load_adaptive(ir, _Op("", "Conv", ["xs", "w"], ["ys"]))               # 2.4 M
    assert not execute_plan.load_adaptive(ir, _Op("", "Conv", ["xb", "w"], ["yb"]))               # 604 M
    assert not execute_plan.load_adaptive(ir, _Op("", "Conv", ["xh", "wh"], ["yh"]))              # float16
    assert not execute_plan.load_adaptive(ir, _Op("", "MatMul", ["a", "b"], ["b"]))               # 33.6 M
    assert not execute_plan.load_adaptive(ir, _Op("", "Relu", ["xb"], ["yb"]))


def test_host_busy_from_the_load_average(monkeypatch):
    """Busy from a 1-minute load average of the CPUs plus HOST_BUSY_MARGIN; busy (one thread)
    where the load average cannot be read."""
    monkeypatch.setattr(execute_plan.os, "cpu_count", lambda: 2)
    for load, busy in ((0.3, False), (2.4, False), (2.5, True), (7.0, True)):
        monkeypatch.setattr(execute_plan.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert execute_plan.host_busy() is busy, load

    def unavailable():
        raise OSError("no load average")
    monkeypatch.setattr(execute_plan.os, "getloadavg", unavailable)
    assert execute_plan.host_busy()


def _executor(shapes):
    """An IrExecutor shell with only what the thread choice reads (tensor shapes and dtypes)."""
    ex = object.__new__(execute.IrExecutor)
    ex.ir = type("Ir", (), {})()
    ex.ir.tensors = {t: _T(s) for t, s in shapes.items()}
    ex.dtype = {t: torch.float32 for t in shapes}
    ex._invariant = {}
    return ex


def _step(op_type="Conv", ins=("x", "w")):
    kernel = type("K", (), {"op_type": op_type})()
    return kernel, {"strides": [1, 1], "__node__": object()}, list(ins), None


def test_the_probe_tells_thread_dependent_results(two_threads):
    """A step whose outputs change with torch's thread count is found thread dependent (it then
    stays on one thread); one that does not is found invariant; each geometry is run once per
    thread count (a cached answer after that, shared by the process's executors)."""
    ex = _executor({"x": [4, 8], "w": [8, 3], "y": [4, 3]})
    calls = []

    def invariant(envs):
        calls.append(torch.get_num_threads())
        for env in envs:
            env["y"] = env["x"] @ env["w"]

    def dependent(envs):
        for env in envs:
            env["y"] = (env["x"] @ env["w"]) * (1.0 + 1e-6 * torch.get_num_threads())

    assert ex._probe_threads(invariant, _step(), 2)
    assert calls == [1, 2] and torch.get_num_threads() == 2
    assert ex._probe_threads(invariant, _step(), 2) and calls == [1, 2]      # cached
    assert not ex._probe_threads(dependent, _step("ConvWeightsGrad"), 2)
    assert not ex._probe_threads(lambda envs: 1 / 0, _step("ConvDataGrad"), 2)     # a failure: one thread


@pytest.mark.parametrize("busy,invariant,want", [(True, True, 1), (False, True, 2), (False, False, 1)])
def test_a_load_adaptive_step_runs_on_torch_threads_only_when_idle_and_invariant(two_threads, monkeypatch,
                                                                               busy, invariant, want):
    """``_ops`` runs a load-adaptive step (``serial`` None) on torch's threads when the host is
    not busy and the step's results do not depend on its threads, else on one thread; a serial
    step on one thread and a parallel one on torch's threads either way; torch's thread count
    is restored after the steps."""
    ex = _executor({"x": [2], "w": [2]})
    monkeypatch.setattr(execute, "host_busy", lambda: busy)
    monkeypatch.setattr(execute.IrExecutor, "_probe_threads", lambda self, run, step, threads: invariant)
    seen = []

    def run(envs):
        seen.append(torch.get_num_threads())
    prepared = [(True, run, (), _step()), (None, run, (), _step()), (False, run, (), _step()), (None, run, (), _step())]
    ex._ops(prepared, [{}])
    assert seen == [1, want, 2, want]
    assert torch.get_num_threads() == 2


def _band_conv_training(monkeypatch, busy: bool, steps: int = 2):
    """A PopART training session of one 3 x 3 convolution in the load-adaptive band (4 x 32 x 16
    x 16 -> 64 channels, 18.9 M multiply-accumulates), SGD with momentum, with the host's load
    seen as ``busy``: the losses, the trained weight and the executor."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    monkeypatch.setattr(execute, "host_busy", lambda: busy)
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 32, 16, 16]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "lab")
    k = b.addInitializedInputTensor((0.1 * rng.standard_normal((64, 32, 3, 3))).astype(np.float32), "k")
    h = b.aiOnnx.relu([b.aiOnnx.conv([x, k], pads=[1, 1, 1, 1])])
    h = b.aiOnnx.reducemean([h], axes=[2, 3], keepdims=0)
    y = b.aiOnnx.softmax([h], axis=1)
    loss = b.aiGraphcore.nllloss([y, lab])
    s, losses, weights = sgd_training(
        b, loss, lambda data: {x: data.standard_normal((4, 32, 16, 16)).astype(np.float32),
                               lab: data.integers(0, 64, (4,)).astype(np.int32)},
        {"k": (64, 32, 3, 3)}, steps)
    return losses, weights["k"], s._fast


def test_a_session_gives_the_same_bits_busy_or_idle(two_threads, monkeypatch):
    """The same training steps with the host seen as idle (the band's convolutions checked and
    run on two threads) and as busy (one thread) give bit-identical losses and weights."""
    monkeypatch.setattr(execute, "_THREAD_INVARIANT", {})
    l_idle, w_idle, fast = _band_conv_training(monkeypatch, busy=False)
    assert fast
    kinds = {op.op_type for st, op in zip(fast._main, fast.ir.ops) if st[0] is None}
    assert {"Conv", "ConvWeightsGrad"} <= kinds
    assert fast._invariant and all(k[-1] == 2 for k in fast._invariant)
    monkeypatch.setattr(execute, "_THREAD_INVARIANT", {})
    l_busy, w_busy, fast_busy = _band_conv_training(monkeypatch, busy=True)
    assert not fast_busy._invariant         # busy: nothing checked, one thread
    assert all(np.array_equal(a.view(np.int32), b.view(np.int32)) for a, b in zip(l_idle, l_busy))
    assert np.array_equal(w_idle.view(np.int32), w_busy.view(np.int32))
