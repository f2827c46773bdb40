"""The IR executor on a torch device (``OPENIPU_TORCH_DEVICE``): the setting and its errors, the
kernels' device discipline (checked on the CPU: no kernel makes a tensor without naming a device
or goes through numpy unannounced), every held tensor on the executor's device after a training
step, and (only where torch sees a CUDA device) CUDA results against the CPU's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import popart
import poptorch
from openipu.popart import torch_device

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")


# -- the setting -------------------------------------------------------------------------------

def test_cpu_is_the_default_and_auto_follows_torch(monkeypatch):
    monkeypatch.delenv("OPENIPU_TORCH_DEVICE", raising=False)
    assert torch_device.resolve() == torch.device("cpu")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", " CPU ")
    assert torch_device.resolve() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_device.resolve("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch_device.resolve("auto") == torch.device("cuda")


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_cuda_device_is_a_popart_error(monkeypatch, value):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(popart.popart_exception, match=r"asks for a CUDA device, but torch sees none"):
        torch_device.resolve(value)


def test_a_cuda_index_past_the_devices_is_a_popart_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(popart.popart_exception, match=r"asks for CUDA device 2, but torch sees 2 \(cuda:0 to cuda:1\)"):
        torch_device.resolve("cuda:2")


@pytest.mark.parametrize("value", ["gpu", "mps", "cuda:x", "meta"])
def test_an_unknown_device_is_a_popart_error(value):
    with pytest.raises(popart.popart_exception, match="OPENIPU_TORCH_DEVICE must be 'cpu', 'cuda', 'cuda:N' or 'auto'"):
        torch_device.resolve(value)


def _inference_session():
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 8]), "x")
    w = b.addInitializedInputTensor(rng.standard_normal((8, 5)).astype(np.float32), "w")
    y = b.aiOnnx.softmax([b.aiOnnx.matmul([x, w])], axis=1)
    s = popart.InferenceSession(fnModel=b.getModelProto(),
                                dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
    return s, x, y


def test_a_session_asked_for_cuda_without_one_raises_popart_error(monkeypatch):
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s, _, _ = _inference_session()
    with pytest.raises(popart.popart_exception, match="OPENIPU_TORCH_DEVICE='cuda' asks for a CUDA device"):
        s.prepareDevice()


def test_poprt_runner_asked_for_cuda_without_one_raises_its_runtime_error(monkeypatch):
    from onnx import TensorProto, helper, numpy_helper

    from poprt import runtime
    from poprt.compiler import Compiler, CompilerOptions
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    exe = Compiler.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
                           options=CompilerOptions(ipu_version="ipu2"))
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", "cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(runtime.PopRTRuntimeError, match="asks for a CUDA device"):
        runtime.Runner(exe)
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", "auto")        # the CPU here
    r = runtime.Runner(exe)
    np.testing.assert_allclose(r.execute({"x": np.ones((2, 4), np.float32)})["y"], np.ones((2, 4)))


def test_the_device_emulation_ignores_the_setting(monkeypatch):
    """The verifying mode always runs on the CPU: the setting is not even read."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s, x, y = _inference_session()
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((3, 8), np.float32)}, a))
    assert not s._fast and np.allclose(a[y].sum(1), 1.0, atol=1e-6)


# -- models run on a device ----------------------------------------------------------------------

class _Encoder(torch.nn.Module):
    """Embedding, a 2-layer transformer encoder (LayerNorm, attention, GELU) and a head with
    cross entropy: the ops of a BERT-like model, small."""

    def __init__(self, dropout: float):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout, activation="gelu", batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, ids, labels=None):
        y = self.head(self.enc(self.emb(ids)).mean(1))
        return y if labels is None else (y, torch.nn.functional.cross_entropy(y, labels))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 50, (4, 8), generator=g), torch.randint(0, 5, (4,), generator=g)


def _infer(monkeypatch, device: str):
    """The encoder's inference outputs (PopTorch, the IR executor on ``device``) and its session."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", device)
    torch.manual_seed(0)
    m = _Encoder(0.0).eval()
    ids, _ = _data()
    im = poptorch.inferenceModel(m)
    out = im(ids).detach().clone()
    s = im._session
    return out, s, im


def _train(monkeypatch, device: str, steps: int = 3, dropout: float = 0.1, fp16: bool = False):
    """The encoder's losses and weights after ``steps`` PopTorch training steps (AdamW; dropout
    draws poprand's streams) on the IR executor on ``device``; and the session."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", device)
    torch.manual_seed(0)
    m = _Encoder(dropout)
    if fp16:
        m = m.half()
    ids, labels = _data()
    opts = poptorch.Options()
    opts.randomSeed(5)
    tm = poptorch.trainingModel(m, opts, optimizer=poptorch.optim.AdamW(m.parameters(), lr=1e-2))
    losses = [float(tm(ids, labels)[1]) for _ in range(steps)]
    weights = {k: v.detach().float().numpy().copy() for k, v in m.state_dict().items()}
    return losses, weights, tm._session, tm


# -- the kernels' device discipline, checked on the CPU -------------------------------------------

_SRC = Path(torch_device.__file__).resolve().parent
#: the executor's code: kernels and what runs them
_KERNEL_CODE = (str(_SRC / "onnx_ops"), str(_SRC / "graphcore_ops"), str(_SRC / "half_partials.py"),
                str(_SRC / "execute.py"), str(_SRC / "fp_behaviour.py"))
#: torch functions that make a tensor on the default device unless told another
_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "eye", "linspace", "logspace",
              "rand", "randn", "randint", "randperm", "scalar_tensor", "empty_strided"}
#: the functions that go through numpy by design (and move their result back: see their docs),
#: the executor's host boundary (``_numpy``: after its one copy to the host) and the reference
#: harness's (``to_numpy``)
_NUMPY_PATHS = {"stochastic_round_half", "_subbyte_cast", "_numpy", "to_numpy"}


class _DeviceAudit(TorchFunctionMode):
    """Records the places in the executor's code that make a tensor without naming its device,
    or read a tensor into numpy outside the numpy paths: each would make a CPU tensor (or fail)
    when the executor runs on another device."""

    def __init__(self):
        super().__init__()
        self.found: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name in _FACTORIES and "device" not in kwargs) or name == "numpy":
            f = sys._getframe(1)
            while f is not None and "/torch/" in f.f_code.co_filename:
                f = f.f_back
            if f is not None and os.path.abspath(f.f_code.co_filename).startswith(_KERNEL_CODE) and not (
                    name == "numpy" and f.f_code.co_name in _NUMPY_PATHS):
                self.found.add(f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}: torch.{name}")
        return func(*args, **kwargs)


def test_the_audit_finds_a_kernel_that_names_no_device():
    """(the check below can fail)"""
    from openipu.popart.onnx_ops.window import _window
    import openipu.popart.onnx_ops.window as mod
    audit = _DeviceAudit()
    src = "def probe(x):\n    return torch.zeros(3) + x\n"
    code = compile(src, mod.__file__, "exec")      # as if written in a kernel module
    scope = {"torch": torch}
    exec(code, scope)
    with audit:
        scope["probe"](torch.ones(3))
        _window([torch.tensor(4)], {}, [0.5, 0.5])
    assert len(audit.found) == 1 and "probe: torch.zeros" in next(iter(audit.found))


def test_kernels_name_their_device_in_inference_and_training(monkeypatch):
    """An encoder's inference and training steps (AdamW, dropout, LayerNorm, attention, GELU,
    cross entropy, their gradients) make no tensor without naming its device."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    monkeypatch.setenv("OPENIPU_TORCH_DEVICE", "cpu")
    torch.manual_seed(0)
    ids, labels = _data()
    im = poptorch.inferenceModel(_Encoder(0.0).eval())
    im(ids)                                                 # compile outside the audit
    m = _Encoder(0.1)
    tm = poptorch.trainingModel(m, optimizer=poptorch.optim.AdamW(m.parameters(), lr=1e-2))
    tm(ids, labels)
    audit = _DeviceAudit()
    with audit:
        im(ids)
        tm(ids, labels)
    assert im._session._fast and tm._session._fast
    assert not audit.found, sorted(audit.found)


@pytest.mark.slow
def test_every_onnx_kernel_names_its_device_in_the_onnx_node_tests():
    """Every single-node test ``onnx.backend.test`` ships, through its kernel: none makes a
    tensor without naming its device (about a minute)."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    from openipu.popart.onnx_ops._reference import check_backend_case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in load_model_tests(kind="node") if len(c.model.graph.node) == 1]
    audit, ran = _DeviceAudit(), 0
    for c in cases:
        try:
            with audit:
                check_backend_case(c)
            ran += 1
        except Exception:  # noqa: BLE001 - the expected failures of test_onnx_ops; only the audit counts here
            pass
    assert ran > 1000 and not audit.found, sorted(audit.found)


def test_every_held_tensor_is_on_the_executor_device_after_a_training_step(monkeypatch):
    _, _, s, _ = _train(monkeypatch, "cpu", steps=1)
    ex = s._fast
    assert ex and ex.device == torch.device("cpu")
    held = dict(ex.held())
    assert any(k.startswith("replica 0 ") for k in held) and any(k.startswith("const ") for k in held)
    assert ex.off_device() == []
    # the check itself: against another device every held tensor is reported
    assert len(torch_device.misplaced(ex.held(), torch.device("meta"))) == len(held)


# -- CUDA against the CPU (only where torch sees a CUDA device) ------------------------------------

@needs_cuda
def test_cuda_inference_matches_the_cpu(monkeypatch):
    cpu, _, _ = _infer(monkeypatch, "cpu")
    gpu, s, _ = _infer(monkeypatch, "cuda")
    assert s._fast.device.type == "cuda" and s._fast.off_device() == []
    np.testing.assert_allclose(gpu.numpy(), cpu.numpy(), rtol=1e-4, atol=1e-5)


@needs_cuda
def test_cuda_training_matches_the_cpu_and_keeps_its_tensors_there(monkeypatch):
    """Dropout's masks come from poprand's CPU streams on every device: the same masks, so the
    same training within float32 tolerance (GPU kernels sum in another order)."""
    l_cpu, w_cpu, _, _ = _train(monkeypatch, "cpu")
    l_gpu, w_gpu, s, _ = _train(monkeypatch, "cuda")
    assert s._fast.device.type == "cuda" and s._fast.off_device() == []
    np.testing.assert_allclose(l_gpu, l_cpu, rtol=1e-4, atol=1e-5)
    for k in w_cpu:
        np.testing.assert_allclose(w_gpu[k], w_cpu[k], rtol=1e-3, atol=1e-4, err_msg=k)


@needs_cuda
def test_cuda_fp16_training_matches_the_cpu_within_half_precision(monkeypatch):
    l_cpu, w_cpu, _, _ = _train(monkeypatch, "cpu", fp16=True)
    l_gpu, w_gpu, s, _ = _train(monkeypatch, "cuda", fp16=True)
    assert s._fast.off_device() == []
    np.testing.assert_allclose(l_gpu, l_cpu, rtol=1e-2, atol=1e-2)
    for k in w_cpu:
        np.testing.assert_allclose(w_gpu[k], w_cpu[k], rtol=1e-2, atol=1e-2, err_msg=k)
