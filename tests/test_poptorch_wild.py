"""PopTorch programs as their users write them (issue 36, the "wild" corpus): each test is one
behaviour such a program relied on that failed before, checked against PopTorch's documented
behaviour or against PyTorch on the CPU."""

from __future__ import annotations

import torch

import poptorch


class PlainCounter(torch.nn.Module):
    """A counter kept in a plain tensor attribute (not a registered buffer)."""

    def __init__(self):
        super().__init__()
        self.i = torch.tensor([0.0])

    def forward(self):
        self.i += 1
        return self.i


def test_plain_tensor_attribute_changed_once_by_the_trace():
    # PopTorch's docs/user_guide/buffers.py: the attribute is a constant of the graph (each run
    # returns 1) and the host tensor is changed once, by the trace
    m = PlainCounter()
    host = m.i
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(), torch.tensor([1.0]))
    torch.testing.assert_close(pm(), torch.tensor([1.0]))
    assert m.i is host
    torch.testing.assert_close(m.i, torch.tensor([1.0]))


def test_unmutated_plain_attribute_left_alone():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = torch.tensor([2.0])

        def forward(self, x):
            return x * self.k

    m = Scale()
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(torch.ones(2)), torch.full((2,), 2.0))
    torch.testing.assert_close(m.k, torch.tensor([2.0]))


def test_strategy_stage_by_block_id():
    # PopTorch's docs/user_guide/mnist.py: strategy.stage("B1").ipu(0) for each block
    for cls in (poptorch.ShardedExecution, poptorch.PipelinedExecution, poptorch.SerialPhasedExecution):
        strategy = cls("B1", "B2")
        assert strategy.stage("B2").blocks == ["B2"]
        assert strategy.stage("B1").ipu(0) is strategy.stage("B1")
        strategy.stage("B2").ipu(1)
        assert [s._ipu for s in strategy.stages] == [0, 1]
        try:
            strategy.stage("B3")
        except AssertionError as e:
            assert "B3" in str(e)
        else:
            raise AssertionError("no error for an unknown block")


def test_sharded_stages_placed_by_stage_ipu():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 2)

        def forward(self, x):
            with poptorch.Block("B1"):
                x = torch.relu(self.a(x))
            with poptorch.Block("B2"):
                return self.b(x)

    torch.manual_seed(0)
    m = Two()
    opts = poptorch.Options()
    strategy = poptorch.ShardedExecution("B1", "B2")
    strategy.stage("B1").ipu(0)
    strategy.stage("B2").ipu(1)
    opts.setExecutionStrategy(strategy)
    pm = poptorch.inferenceModel(m, opts)
    x = torch.randn(3, 4)
    torch.testing.assert_close(pm(x), m(x).detach(), rtol=1e-5, atol=1e-6)
    assert pm._built.num_ipus == 2


class WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.loss = torch.nn.MSELoss()

    def forward(self, x, target=None):
        out = self.fc(x)
        if self.training:
            return out, self.loss(out, target)
        return out


def test_wrapper_keeps_the_training_flag_of_wrapping_time():
    # PopTorch wraps a shallow copy: model.eval() / model.train() after wrapping does not change
    # the wrapper's mode (docs/user_guide/trainingModel.py and precompilation.py)
    torch.manual_seed(0)
    model = WithLoss()
    model.eval()
    inf = poptorch.inferenceModel(model)
    model.train()
    train = poptorch.trainingModel(model)
    model.eval()                                   # after wrapping: the training wrapper still trains
    x, t = torch.randn(2, 4), torch.randn(2, 4)
    out, loss = train(x, t)
    assert loss.dim() == 0 and not model.training
    torch.testing.assert_close(inf(x), model(x).detach(), rtol=1e-5, atol=1e-6)
    assert not model.training and not model.fc.training     # the host model's flags are left as they were


def test_wrapper_eval_sets_the_wrappers_own_mode():
    # PopTorch: inferenceModel(model) wraps a shallow copy, and inference_model.eval() sets that
    # copy's flag, so a model still in training mode at wrapping time runs its inference path
    # (Graphcore's PyG tutorial 4: inferenceModel(model) after training, then .eval())
    torch.manual_seed(0)
    model = WithLoss()
    model.train()
    inf = poptorch.inferenceModel(model)
    assert inf.eval() is inf
    x = torch.randn(2, 4)
    out = inf(x)
    assert out.shape == (2, 4)
    torch.testing.assert_close(out, model.fc(x).detach(), rtol=1e-5, atol=1e-6)
    assert model.training and not model.fc.training    # top-level flag is the copy's; submodules shared


def test_load_drops_the_offline_target(tmp_path):
    # PopTorch's poptorch.load: a model compiled with useOfflineIpuTarget runs once loaded
    # (docs/user_guide/precompilation.py)
    torch.manual_seed(0)
    model = WithLoss()
    opts = poptorch.Options().useOfflineIpuTarget(poptorch.ipuHardwareVersion())
    pm = poptorch.trainingModel(model, opts)
    x, t = torch.randn(2, 4), torch.randn(2, 4)
    path = str(tmp_path / "training.poptorch")
    pm.compileAndExport(path, x, t)
    pm.destroy()
    loaded = poptorch.load(path)
    assert loaded.options.connection_type == poptorch.ConnectionType.Always
    out, loss = loaded(x, t)
    assert out.shape == (2, 4) and loss.dim() == 0


class LoopWithState(torch.nn.Module):
    """A ``poptorch.for_loop`` body that reads and overwrites a buffer (``copy_``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.register_buffer("accu", torch.tensor([0.5]))

    def body(self, val):
        val = self.lin(val + self.accu)
        self.accu.copy_(val)
        return [val]

    def forward(self, x):
        return poptorch.for_loop(3, self.body, [x])


def test_for_loop_body_changing_a_buffer_matches_cpu():
    import copy

    torch.manual_seed(0)
    m = LoopWithState()
    ref = copy.deepcopy(m)
    pm = poptorch.inferenceModel(m)
    x = torch.tensor([0.25])
    for _ in range(2):
        out = pm(x)[0]
        with torch.no_grad():
            expected = ref(x)[0]
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    pm.copyWeightsToHost()
    torch.testing.assert_close(m.accu, ref.accu, rtol=1e-5, atol=1e-6)


class ReshapeInSecondStage(torch.nn.Module):
    """view(-1, n) inside a block placed by a Stage: the reshape's shape is a Constant with
    PopART's placement attributes (Graphcore's pipelining tutorial, docs/user_guide/mnist.py)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(8, 2)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, labels):
        with poptorch.Block("B1"):
            x = torch.relu(self.a(x))
        with poptorch.Block("B2"):
            out = self.b(x.view(-1, 8))
            return out, self.loss(out, labels)


def test_sharded_stage_with_reshape_trains_like_cpu():
    import copy

    torch.manual_seed(0)
    m = ReshapeInSecondStage()
    ref = copy.deepcopy(m)
    opts = poptorch.Options().deviceIterations(2)
    opts.setExecutionStrategy(poptorch.ShardedExecution(poptorch.Stage("B1").ipu(0), poptorch.Stage("B2").ipu(1)))
    pm = poptorch.trainingModel(m, opts, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    x, y = torch.randn(2, 3, 2, 4), torch.randint(0, 2, (2, 3))
    pm(x.reshape(6, 2, 4), y.reshape(6))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(2):                          # two device iterations: two SGD steps
        opt.zero_grad()
        _, loss = ref(x[i], y[i])
        loss.backward()
        opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)


def test_non_contiguous_inputs_are_copied_in():
    """A transposed or strided input runs as its values (PopTorch copies inputs into its host
    buffers), in inference and training."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    x = torch.randn(6, 4).t()                       # [4, 6], not contiguous
    assert not x.is_contiguous()
    got = poptorch.inferenceModel(lin)(x)
    torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-5)
    got = poptorch.inferenceModel(lin)(torch.randn(8, 6)[::2])
    assert got.shape == (4, 3)

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 3)

        def forward(self, x):
            y = self.lin(x)
            return y, poptorch.identity_loss((y * y).sum(), reduction="none")

    model = Loss()
    ref = Loss()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    poptorch.trainingModel(model, optimizer=opt)(x)
    (ref(x)[1]).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    torch.testing.assert_close(model.lin.weight, ref.lin.weight, rtol=1e-5, atol=1e-5)


def test_ctc_beam_search_decoder_finds_the_most_probable_labelling():
    """``poptorch.ctc_beam_search_decoder`` on the IPU: with beams enough for every prefix, the top
    paths are the labellings of highest probability summed over their alignments (brute force
    over all C**T alignments), with their log-probabilities and lengths (PopTorch's three
    outputs: [B, P] probs' type, [B, P] and [B, P, T] int32)."""
    import itertools
    import math

    torch.manual_seed(3)
    T, B, C, P = 4, 2, 3, 2
    lp = torch.randn(T, B, C).mul(2).log_softmax(2)
    lens = torch.tensor([4, 3])

    class Decode(torch.nn.Module):
        def forward(self, lp, lens):
            return poptorch.ctc_beam_search_decoder(lp, lens, blank=0, beam_width=16, top_paths=P)

    probs, lengths, paths = poptorch.inferenceModel(Decode())(lp, lens)
    assert probs.shape == (B, P) and lengths.dtype == torch.int32 and paths.shape == (B, P, T)
    for b in range(B):
        t_b = int(lens[b])
        score: dict = {}
        for align in itertools.product(range(C), repeat=t_b):
            label = tuple(k for i, k in enumerate(align) if k != 0 and (i == 0 or align[i - 1] != k))
            s = sum(float(lp[t, b, k]) for t, k in enumerate(align))
            score[label] = float(torch.logaddexp(torch.tensor(score[label]), torch.tensor(s))) if label in score else s
        best = sorted(score.items(), key=lambda kv: -kv[1])[:P]
        for p, (label, s) in enumerate(best):
            assert int(lengths[b, p]) == len(label)
            assert tuple(int(v) for v in paths[b, p, :len(label)]) == label
            assert math.isclose(float(probs[b, p]), s, abs_tol=1e-4)
