"""In-place semantics of wrapped models, checked against PyTorch on the CPU (issue 36): a model
that changes its input (``x += 1``, ``x[:, 0] = v``) updates the caller's tensor after each run,
as PopTorch copies the new value back; a buffer changed in place (``add_``, ``copy_``, ``+=``,
BatchNorm's running statistics) keeps its value on the device from run to run and reaches the
module when weights are copied to the host (after each training run; ``copyWeightsToHost`` for
inference, PopTorch's ``docs/user_guide/buffers.py``); ``requires_grad=False`` parameters are
never updated by the optimizer."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch


class AddToInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x, y):
        x += 1
        y[:, 0] = 5.0
        return self.fc(x) + y


def test_inference_input_mutation_is_copied_back():
    torch.manual_seed(0)
    m = AddToInput().eval()
    pm = poptorch.inferenceModel(m)
    x, y = torch.zeros(2, 3), torch.ones(2, 3)
    cx, cy = x.clone(), y.clone()
    for _ in range(2):
        out = pm(x, y)
        ref = m(cx, cy)
        torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x, cx)
        torch.testing.assert_close(y, cy)
    assert x[0, 0].item() == 2.0 and y[0, 0].item() == 5.0


def test_input_mutation_with_device_iterations():
    """Each of the call's 4 iterations changes its own rows; the caller's tensor gets all of them."""
    class Double(torch.nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x.sum(dim=1)
    pm = poptorch.inferenceModel(Double(), poptorch.Options().deviceIterations(4))
    x = torch.arange(8, dtype=torch.float32).reshape(8, 1)
    ref = x * 2
    out = pm(x)
    torch.testing.assert_close(x, ref)
    torch.testing.assert_close(out, ref.sum(dim=1))


def test_training_input_mutation_is_copied_back():
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x, t):
            x.mul_(2)
            return torch.nn.functional.mse_loss(self.fc(x), t)
    m = M()
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    x, t = torch.ones(4, 3), torch.zeros(4, 3)
    pm(x, t)
    torch.testing.assert_close(x, torch.full((4, 3), 2.0))


class Counter(torch.nn.Module):
    """PopTorch's ``buffers.py`` example, plus ``copy_`` into a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("i", torch.tensor([0.0]))
        self.register_buffer("last", torch.zeros(2))

    def forward(self, x):
        self.i += 1
        self.last.copy_(x.sum(0))
        return self.i * 1.0, self.last * 1.0


def test_inference_buffer_persists_on_device_and_needs_copy_to_host():
    m = Counter()
    pm = poptorch.inferenceModel(m)
    out1, _ = pm(torch.ones(3, 2))
    out2, last = pm(torch.full((3, 2), 2.0))
    torch.testing.assert_close(out1, torch.tensor([1.0]))
    torch.testing.assert_close(out2, torch.tensor([2.0]))
    torch.testing.assert_close(last, torch.tensor([6.0, 6.0]))
    # inference: the buffers are not copied to the host implicitly (PopTorch's note)
    torch.testing.assert_close(m.i, torch.tensor([0.0]))
    pm.copyWeightsToHost()
    torch.testing.assert_close(m.i, torch.tensor([2.0]))
    torch.testing.assert_close(m.last, torch.tensor([6.0, 6.0]))


def test_plain_tensor_attribute_is_a_constant():
    """PopTorch's "wrong way to have a persistent tensor": a plain tensor attribute is captured as
    a constant, so each call returns 1. (PopTorch's trace also changes the host tensor once;
    openipu's capture leaves it as it was.)"""
    class Wrong(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.i = torch.tensor([0.0])

        def forward(self):
            self.i += 1
            return self.i * 1.0
    m = Wrong()
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(), torch.tensor([1.0]))
    torch.testing.assert_close(pm(), torch.tensor([1.0]))
    assert "i" not in m._buffers and isinstance(m.i, torch.Tensor)


class Trained(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(3, 3)
        self.frozen.weight.requires_grad_(False)
        self.bn = torch.nn.BatchNorm1d(3)
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("seen", torch.zeros(3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int32))

    def forward(self, x, t):
        self.seen.add_(x.sum(0))
        self.steps += 1
        y = self.fc(self.bn(self.frozen(x)))
        return y, torch.nn.functional.mse_loss(y, t)


def test_training_buffers_batchnorm_and_frozen_parameters_match_pytorch():
    torch.manual_seed(0)
    m = Trained()
    ref = copy.deepcopy(m)
    frozen_before = m.frozen.weight.detach().clone()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, weight_decay=0.1)
    pm = poptorch.trainingModel(m, optimizer=poptorch.optim.SGD(m.parameters(), lr=0.1, weight_decay=0.1))
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    for _ in range(3):
        _, loss = pm(x, t)
        opt.zero_grad()
        _, lref = ref(x, t)
        lref.backward()
        opt.step()
        torch.testing.assert_close(loss, lref.detach(), rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a.to(b.dtype), b, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(m.frozen.weight, frozen_before)        # never updated, even with weight decay
    assert int(m.steps) == 3 and int(m.bn.num_batches_tracked) == 3


def test_frozen_parameter_with_adam_and_gradient_accumulation():
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    m[0].bias.requires_grad_(False)
    before, w_before = m[0].bias.detach().clone(), m[0].weight.detach().clone()

    class WithLoss(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x, t):
            return torch.nn.functional.mse_loss(self.net(x), t)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    pm = poptorch.trainingModel(WithLoss(m), opts, poptorch.optim.Adam(m.parameters(), lr=0.1))
    pm(torch.randn(4, 4), torch.randn(4, 1))
    torch.testing.assert_close(m[0].bias, before)
    assert not torch.allclose(m[0].weight, w_before)              # the trainable weight did move


def test_changed_buffer_with_broadcast_across_replicas_raises():
    opts = poptorch.Options().replicationFactor(2)
    with pytest.raises(poptorch.Error, match="does not support broadcasting buffers"):
        poptorch.inferenceModel(Counter(), opts)(torch.ones(2, 2))
    # broadcastBuffers(False): each replica keeps its own buffer
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    out, _ = poptorch.inferenceModel(Counter(), opts)(torch.ones(2, 2))
    torch.testing.assert_close(out, torch.tensor([1.0, 1.0]))


def test_copy_named_buffers_to_device():
    m = Counter()
    opts = poptorch.Options().updatableNamedBuffers(["i"])
    pm = poptorch.inferenceModel(m, opts)
    pm(torch.ones(1, 2))
    with torch.no_grad():
        m.i.fill_(10.0)
    pm.copyNamedBuffersToDevice()
    out, _ = pm(torch.ones(1, 2))
    torch.testing.assert_close(out, torch.tensor([11.0]))
    with pytest.raises(poptorch.Error, match="No named buffers marked as updatable"):
        other = poptorch.inferenceModel(Counter())
        other(torch.ones(1, 2))
        other.copyNamedBuffersToDevice()


def test_reassigned_buffer_or_parameter_raises():
    class Reassign(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.zeros(2))

        def forward(self, x):
            self.buf = self.buf + x
            return self.buf * 1
    with pytest.raises(poptorch.Error, match=r"Buffer buf is reassigned within the model when calling the forward "
                                             r"method. This is not supported. Consider using self.buf.copy_\(src\)"):
        poptorch.inferenceModel(Reassign())(torch.ones(2))

    class Plain(torch.nn.Module):           # a plain tensor attribute may be replaced (it is a constant)
        def __init__(self):
            super().__init__()
            self.t = torch.ones(2)

        def forward(self, x):
            self.t = self.t * 2
            return x + self.t
    torch.testing.assert_close(poptorch.inferenceModel(Plain())(torch.zeros(2)), torch.full((2,), 2.0))


def test_training_buffers_must_be_plain_tensors():
    class Odd(torch.Tensor):
        pass
    m = Counter()
    m.i = torch.zeros(1).as_subclass(Odd)
    with pytest.raises(poptorch.Error, match="All buffers must be an instance of torch.Tensor"):
        poptorch.trainingModel(m)
