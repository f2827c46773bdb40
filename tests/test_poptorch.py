"""PopTorch (``import poptorch``): capture, lowering and PopTorch's batching, weights and errors,
against the same ``torch.nn`` modules on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch


class Net(torch.nn.Module):
    """A small classifier returning ``(logits, loss)`` with labels, ``logits`` without."""

    def __init__(self, loss=None):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        self.loss = loss or torch.nn.CrossEntropyLoss()

    def forward(self, x, y=None):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out if y is None else (out, self.loss(out, y))


def _data(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 10, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_inference_matches_the_module():
    torch.manual_seed(0)
    m = Net()
    x, _ = _data()
    out = poptorch.inferenceModel(m)(x)
    torch.testing.assert_close(out, m(x), rtol=1e-5, atol=1e-6)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "poptorch-sgd": lambda p: poptorch.optim.SGD(p, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_matches_torch_optim(name):
    """Three calls of a trainingModel give the weights of three torch.optim steps."""
    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)
    opt = OPTIMIZERS[name](ref.parameters())
    tm = poptorch.trainingModel(m, optimizer=OPTIMIZERS[name](m.parameters()))
    for step in range(3):
        x, y = _data(seed=step)
        out, loss = tm(x, y)
        opt.zero_grad()
        ref_out, ref_loss = ref(x, y)
        ref_loss.backward()
        opt.step()
        assert loss.shape == () and float(loss) == pytest.approx(float(ref_loss.detach()), rel=1e-5)
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=n)
    assert "Gradient___fc1.weight" in tm.getTensorNames()


def test_batching_rules():
    """deviceIterations x replicas x gradient accumulation micro-batches per call: the loss of
    every micro-batch comes back under OutputMode.All, one update per device iteration."""
    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)
    o = poptorch.Options().deviceIterations(2).replicationFactor(2).outputMode(poptorch.OutputMode.All)
    o.Training.gradientAccumulation(3)
    tm = poptorch.trainingModel(m, o, torch.optim.SGD(m.parameters(), lr=0.1))
    x, y = _data(n=2 * 2 * 3 * 4)           # micro-batch 4
    out, loss = tm(x, y)
    assert out.shape == (48, 4) and loss.shape == (12,)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    # PopART order of the combined batch: [iteration][micro-batch][replica][sample]
    xs, ys = x.reshape(2, 3, 2, 4, 10), y.reshape(2, 3, 2, 4)
    for i in range(2):
        opt.zero_grad()
        losses = [ref(xs[i, a, r], ys[i, a, r])[1] for a in range(3) for r in range(2)]
        torch.stack(losses).mean().backward()      # Mean reduction over micro-batches and replicas
        opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_anchor_mode_is_the_deprecated_name_of_output_mode():
    """Scripts written for PopTorch before 2.5 call ``anchorMode(AnchorMode.X)``: it warns and
    sets the output mode, with ``outputMode``'s checks; an inference model then returns what
    ``outputMode`` would."""
    with pytest.warns(DeprecationWarning, match="outputMode"):
        o = poptorch.Options().deviceIterations(4).anchorMode(poptorch.AnchorMode.Final)
    assert o.output_mode == poptorch.OutputMode.Final
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="output_return_period"):
        poptorch.Options().anchorMode(poptorch.AnchorMode.EveryN)
    torch.manual_seed(0)
    m = Net().eval()
    x, _ = _data(n=16)
    out, _ = poptorch.inferenceModel(m, o)(x, torch.zeros(16, dtype=torch.long))
    assert out.shape == (4, 4)      # the last of 4 device iterations of 4 samples
    torch.testing.assert_close(out, m(x[12:], torch.zeros(4, dtype=torch.long))[0], rtol=1e-5, atol=1e-6)


def test_inference_after_training_sees_the_new_weights():
    torch.manual_seed(0)
    m = Net()
    x, y = _data()
    im = poptorch.inferenceModel(m)
    before = im(x)
    tm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.5))
    tm(x, y)
    after = im(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, m(x), rtol=1e-5, atol=1e-6)


def test_errors():
    torch.manual_seed(0)
    m = Net()
    x, y = _data(n=6)
    o = poptorch.Options().deviceIterations(4)
    with pytest.raises(poptorch.Error, match=r"Invalid batch dimension: In the input x, the batch dimension \(6\)"):
        poptorch.inferenceModel(m, o)(x)
    im = poptorch.inferenceModel(m)
    im(x)
    with pytest.raises(poptorch.Error, match="don't match the inputs used to compile the model"):
        im(torch.randn(3, 10))
    o = poptorch.Options()
    o.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="gradientAccumulation to 1"):
        poptorch.inferenceModel(m, o)
    with pytest.raises(poptorch.Error, match="Couldn't find a loss in graph"):
        poptorch.trainingModel(Net())(x)

    class TwoLosses(Net):
        def forward(self, x, y):
            out = self.fc2(torch.relu(self.fc1(x)))
            return self.loss(out, y) + torch.nn.functional.mse_loss(out, torch.zeros_like(out))
    with pytest.raises(poptorch.Error, match="Multiple independent losses found in graph"):
        poptorch.trainingModel(TwoLosses())(x, y)

    class Item(Net):
        def forward(self, x):
            return x * int(x.sum() > 0)
    with pytest.raises(poptorch.Error, match="reads a tensor's value on the host"):
        poptorch.inferenceModel(Item())(x)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        im.options.deviceIterations(2)


def test_identity_loss_of_two_losses_trains():
    torch.manual_seed(0)

    class TwoLosses(Net):
        def forward(self, x, y):
            out = self.fc2(torch.relu(self.fc1(x)))
            return out, poptorch.identity_loss(self.loss(out, y) + 0.5 * out.pow(2).mean(), reduction="sum")
    m = TwoLosses()
    ref = copy.deepcopy(m)
    tm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    x, y = _data()
    tm(x, y)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(x, y)[1].backward()
    opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_blocks_place_layers_on_ipus():
    """BeginBlock over 2 IPUs, sharded and pipelined: the same trained weights as one IPU."""
    results = {}
    for strategy in (None, "sharded", "pipelined"):
        torch.manual_seed(0)
        m = Net()
        if strategy:
            poptorch.BeginBlock(m.fc1, "b0", ipu_id=0)
            poptorch.BeginBlock(m.fc2, "b1", ipu_id=1)
        o = poptorch.Options().deviceIterations(2)
        o.Training.gradientAccumulation(4)
        if strategy == "sharded":
            o.setExecutionStrategy(poptorch.ShardedExecution())
        tm = poptorch.trainingModel(m, o, torch.optim.SGD(m.parameters(), lr=0.1))
        x, y = _data(n=2 * 4 * 2)
        tm(x, y)
        results[strategy] = [p.detach().clone() for p in m.parameters()]
        if strategy:
            assert tm._built.num_ipus == 2 and tm._built.pipelined == (strategy == "pipelined")
    for s in ("sharded", "pipelined"):
        for p, q in zip(results[s], results[None]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_ops_before_the_first_block_are_a_stage_of_their_own_with_auto_increment():
    """One BeginBlock(ipu_id=1) mid-model under PipelinedExecution(AutoStage.AutoIncrement)
    (graphcore/examples' FastPitch): the layers before it run on IPU 0 as stage 0 and the block
    is stage 1 (PopTorch numbers AutoIncrement's stages from 1), so the model is pipelined over
    2 IPUs (autoRecomputation Pipeline needs that) and trains to the one-IPU weights."""
    results = {}
    for block in (False, True):
        torch.manual_seed(0)
        m = Net()
        o = poptorch.Options().deviceIterations(2)
        o.Training.gradientAccumulation(4)
        if block:
            poptorch.BeginBlock(m.fc2, "b1", ipu_id=1)
            o.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
            o._Popart.set("autoRecomputation", 3)       # RecomputationType.Pipeline
        tm = poptorch.trainingModel(m, o, torch.optim.SGD(m.parameters(), lr=0.1))
        x, y = _data(n=2 * 4 * 2)
        tm(x, y)
        results[block] = [p.detach().clone() for p in m.parameters()]
        if block:
            assert tm._built.num_ipus == 2 and tm._built.pipelined
    for p, q in zip(results[True], results[False]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_cycle_count_is_a_prediction():
    m = Net()
    im = poptorch.inferenceModel(m, poptorch.Options().logCycleCount(True))
    im(_data()[0])
    assert im.cycleCount() > 0
    with pytest.raises(poptorch.Error, match="Cycle count logging is disabled"):
        poptorch.inferenceModel(Net()).cycleCount()


@pytest.mark.parametrize("mode", ["Sync", "Async"])
def test_dataloader_combined_batch(mode):
    """One batch of the loader is one call's worth: batch x iterations x replicas x accumulation."""
    ds = torch.utils.data.TensorDataset(torch.arange(200).float().reshape(100, 2), torch.arange(100))
    o = poptorch.Options().deviceIterations(3).replicationFactor(2)
    o.Training.gradientAccumulation(2)
    dl = poptorch.DataLoader(o, ds, batch_size=4, mode=getattr(poptorch.DataLoaderMode, mode))
    assert dl.combinedBatchSize == 48 and len(dl) == 2
    assert dl._combined_batch_size == 48  # PopTorch's attribute, read by applications (FastPitch)
    for epoch in range(2):
        batches = [b for b in dl]
        assert [b[0].shape for b in batches] == [(48, 2)] * 2
        assert torch.equal(batches[1][1], torch.arange(48, 96))
    dl.terminate()


def test_parameter_groups_keep_their_own_values():
    """A second parameter group's learning rate becomes PopART's per-weight value."""
    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)

    def groups(net):
        return [{"params": net.fc1.parameters(), "lr": 0.05}, {"params": net.fc2.parameters()}]
    tm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(groups(m), lr=0.1, momentum=0.9))
    opt = torch.optim.SGD(groups(ref), lr=0.1, momentum=0.9)
    x, y = _data()
    for _ in range(2):
        tm(x, y)
        opt.zero_grad()
        ref(x, y)[1].backward()
        opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["ir", "device"])
def test_weight_upload_keeps_the_device_optimizer_state(monkeypatch, mode):
    """A training model syncs its trained weights into the module after each call (on the IR
    executor straight from its variables, without the session's host copies); sending the
    module's weights again (``copyWeightsToDevice``, a detach and attach) sends the device's
    momentum with them, not the one of the first upload: the run equals torch.optim's."""
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    tm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    for step in range(4):
        x, y = _data(seed=step)
        tm(x, y)
        opt.zero_grad()
        ref(x, y)[1].backward()
        opt.step()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
        if step == 1:
            tm.copyWeightsToDevice()
        elif step == 2:
            tm.detachFromDevice()
            tm.attachToDevice()
    assert tm._session._device_weights() is None if mode == "device" else \
        set(tm._session._device_weights()) >= set(tm._session._host_weights)
