"""Ops PopTorch programs use that openipu lacked (issue 36, the most common first): strided and
negative slices, boolean-mask assignment, bitwise ops and shifts on int32, ``scatter(...,
reduce=)``, ``scatter_reduce`` and ``index_reduce`` modes, ``erfc``, ``BatchNorm1d`` on 2-D
inputs, ``addmm`` / ``addmv`` with ``beta=0`` (NaN in the input ignored). Each runs as an
inference model and is compared with PyTorch on the CPU."""

from __future__ import annotations

import pytest
import torch

import poptorch


def _check(fn, *args, exact=False):
    class M(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)
    ref = fn(*[a.clone() for a in args])
    out = poptorch.inferenceModel(M())(*[a.clone() for a in args])
    if exact:
        assert torch.equal(out.to(ref.dtype), ref), (out, ref)
    else:
        torch.testing.assert_close(out.to(ref.dtype), ref, rtol=1e-5, atol=1e-5, equal_nan=True)


torch.manual_seed(0)
X = torch.randn(6, 8)
XI = torch.randint(-1000, 1000, (6, 8), dtype=torch.int32)
IDX = torch.randint(0, 4, (6, 8))
PERM = torch.stack([torch.randperm(6) for _ in range(8)], 1)      # each column a permutation: no collision


@pytest.mark.parametrize("fn", [lambda a: a[:, 1::2], lambda a: a[::3, 2:7:2], lambda a: a[-3:, :-2],
                                lambda a: a[-4:-1, -1]], ids=["step", "step2", "negative", "negative2"])
def test_strided_and_negative_slices(fn):
    _check(fn, X, exact=True)


def _mask_set(a):
    a = a.clone()
    a[a > 0] = 0.5
    return a


def _mask_row(a):
    a = a.clone()
    a[a[:, 0] > 0] = torch.arange(8.0)
    return a


def _mask_accumulate(a):
    return a.index_put((a[:, 0] > 0,), torch.arange(8.0), accumulate=True)


@pytest.mark.parametrize("fn", [_mask_set, _mask_row, _mask_accumulate], ids=["scalar", "row", "accumulate"])
def test_boolean_mask_assignment(fn):
    _check(fn, X)


def test_boolean_mask_selection_raises_data_dependent_shape():
    class M(torch.nn.Module):
        def forward(self, a):
            return a[a > 0].sum()
    with pytest.raises(poptorch.Error, match="data-dependent shape"):
        poptorch.inferenceModel(M())(X)


@pytest.mark.parametrize("fn", [lambda a: a & 0x3F, lambda a: a | 0x55, lambda a: a ^ (a >> 1), lambda a: ~a,
                                lambda a: a << 3, lambda a: a >> 2, lambda a: a & a.flip(0),
                                lambda a: (a > 0) ^ (a < 100)],
                         ids=["and", "or", "xor_shift", "not", "lshift", "rshift_negative", "and_tensor", "xor_bool"])
def test_bitwise_int32_bit_exact(fn):
    _check(fn, XI, exact=True)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_modes(reduce, include_self):
    _check(lambda a, i: torch.full((4, 8), 0.5).scatter_reduce(0, i, a, reduce=reduce, include_self=include_self),
           X, IDX)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_reduce_argument(reduce):
    _check(lambda a, i: torch.full((4, 8), 0.5).scatter(0, i, a, reduce=reduce), X, IDX)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce):
    index = torch.tensor([0, 2, 1, 0, 2, 2])
    _check(lambda a: torch.ones(3, 8).index_reduce(0, index, a, reduce, include_self=False), X)
    _check(lambda a: torch.ones(8, 3).index_reduce(1, index, a.t(), reduce), X)


def test_erfc():
    _check(torch.erfc, X * 2)


def test_batchnorm1d_on_2d_inputs():
    torch.manual_seed(1)
    bn = torch.nn.BatchNorm1d(8).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    _check(lambda a: bn(a).detach(), X)


def test_addmm_addmv_beta_zero_ignores_nan():
    _check(lambda a, b: torch.addmm(torch.full((6, 6), float("nan")), a, b, beta=0), X, torch.randn(8, 6))
    _check(lambda a, v: torch.addmv(torch.full((6,), float("nan")), a, v, beta=0, alpha=2), X, torch.randn(8))


def test_as_strided():
    _check(lambda a: a.as_strided((3, 4), (8, 2), 1), X, exact=True)
    _check(lambda a: a.as_strided((2, 2, 2), (1, 8, 3)), X, exact=True)


def test_randperm_is_a_permutation():
    class M(torch.nn.Module):
        def forward(self, a):
            return torch.randperm(16) + a
    out = poptorch.inferenceModel(M(), poptorch.Options().randomSeed(3))(torch.zeros(16, dtype=torch.long))
    assert sorted(out.tolist()) == list(range(16)) and out.tolist() != list(range(16))


def test_bilinear_inference_and_training():
    torch.manual_seed(2)
    bil = torch.nn.Bilinear(5, 4, 3)
    a, b = torch.randn(2, 6, 5), torch.randn(2, 6, 4)
    _check(lambda u, v: bil(u, v).detach(), a, b)

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bil = torch.nn.Bilinear(5, 4, 3)

        def forward(self, u, v):
            return torch.nn.functional.mse_loss(self.bil(u, v), torch.zeros(2, 6, 3))
    import copy
    m = L()
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    loss = pm(a, b)
    opt.zero_grad()
    lref = ref(a, b)
    lref.backward()
    opt.step()
    torch.testing.assert_close(loss, lref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.bil.weight, ref.bil.weight, rtol=1e-5, atol=1e-6)


def test_ctc_loss_inference_and_training():
    import copy
    torch.manual_seed(0)
    t_, n_, c_, s_ = 12, 3, 5, 4

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, c_)
            self.ctc = torch.nn.CTCLoss()

        def forward(self, x, tgt, il, tl):
            lp = self.fc(x).log_softmax(2)
            return lp, self.ctc(lp, tgt, il, tl)
    x, tgt = torch.randn(t_, n_, 6), torch.randint(1, c_, (n_, s_))
    il, tl = torch.full((n_,), t_, dtype=torch.long), torch.tensor([4, 3, 2])
    m = M()
    ref = copy.deepcopy(m)
    _, loss = poptorch.inferenceModel(m)(x, tgt, il, tl)
    torch.testing.assert_close(loss, ref(x, tgt, il, tl)[1].detach(), rtol=1e-5, atol=1e-5)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    pm(x, tgt, il, tl)
    opt.zero_grad()
    ref(x, tgt, il, tl)[1].backward()
    opt.step()
    torch.testing.assert_close(m.fc.weight, ref.fc.weight, rtol=1e-5, atol=1e-5)


def test_bincount_with_minlength():
    v = torch.randint(0, 6, (20,))
    _check(lambda a: torch.bincount(a, minlength=6), v, exact=True)
    _check(lambda a, w: a.bincount(w, minlength=8), v, torch.rand(20))

    class NoMin(torch.nn.Module):
        def forward(self, a):
            return torch.bincount(a)
    with pytest.raises(poptorch.Error, match="needs minlength"):
        poptorch.inferenceModel(NoMin())(v)


def test_for_loop_trains_unrolled():
    import copy
    torch.manual_seed(0)

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = poptorch.for_loop(3, lambda t: torch.tanh(self.fc(t)), [x])[0]
            return y, poptorch.identity_loss(y.pow(2), "mean")
    m = L()
    ref = copy.deepcopy(m)
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    _, loss = pm(torch.ones(2, 4))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt.zero_grad()
    _, lref = ref(torch.ones(2, 4))
    lref.backward()
    opt.step()
    torch.testing.assert_close(loss, lref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.fc.weight, ref.fc.weight, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"expects input tensors \(inputs\) to be a list of tensors"):
        poptorch.for_loop(2, lambda a: a, (torch.ones(1),))


# -- one training step of each differentiable op above, against torch.optim.SGD on the CPU ------
class _Train(torch.nn.Module):
    """``fn(x * w)`` for a weight ``w`` of ``x``'s shape (ones, plus a seeded perturbation), loss
    the mean square of the result: the weight's update carries the op's gradient."""

    def __init__(self, fn, shape):
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(shape, generator=g))
        self.fn = fn

    def forward(self, x):
        y = self.fn(x * self.w)
        return y, poptorch.identity_loss((y.float() ** 2).mean(), "none")


def _train_check(fn, x, lr=0.1):
    import copy
    m = _Train(fn, x.shape)
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    y_ref, l_ref = ref(x.clone())
    opt.zero_grad()
    l_ref.backward()
    opt.step()
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=lr))
    y, loss = pm(x.clone())
    torch.testing.assert_close(y, y_ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, l_ref.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(ref.w, 1 + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(4)))
    torch.testing.assert_close(m.w.detach(), ref.w.detach(), rtol=1e-5, atol=1e-6)


def _mask_row_train(a):
    a = a.clone()
    a[a[:, 0] > 0] = torch.arange(8.0)
    return a


def _mask_set_tensor(a):
    b = a.clone()
    b[a > 0] = 0.5
    return b


TRAIN = {
    "strided_slice": lambda a: a[::3, 2:7:2],
    "negative_slice": lambda a: a[-4:-1, :-2],
    "mask_assign_scalar": _mask_set_tensor,
    "mask_assign_row": _mask_row_train,
    "mask_accumulate": lambda a: a.index_put((a[:, 0] > 0,), torch.arange(8.0), accumulate=True),
    "masked_where": lambda a: torch.where(a > 0.5, a, a * 0.1),
    "scatter_sum": lambda a: torch.full((4, 8), 0.5).scatter_reduce(0, IDX, a, "sum"),
    "scatter_mean": lambda a: torch.full((4, 8), 0.5).scatter_reduce(0, IDX, a, "mean", include_self=False),
    "scatter_amax": lambda a: torch.full((4, 8), -5.0).scatter_reduce(0, IDX, a, "amax"),
    "scatter_src": lambda a: torch.zeros(6, 8).scatter(0, PERM, a),
    "index_reduce_mean": lambda a: torch.ones(3, 8).index_reduce(0, torch.tensor([0, 2, 1, 0, 2, 2]), a, "mean"),
    "index_reduce_amax": lambda a: torch.zeros(3, 8).index_reduce(0, torch.tensor([0, 2, 1, 0, 2, 2]), a, "amax",
                                                                  include_self=False),
    "erfc": lambda a: torch.erfc(a),
    "as_strided": lambda a: a.as_strided((3, 4), (8, 2), 1),
    "addmm_beta0": lambda a: torch.addmm(torch.full((6, 6), float("nan")), a, torch.ones(8, 6) * 0.3, beta=0),
    "addmv_beta0": lambda a: torch.addmv(torch.full((6,), float("nan")), a, torch.arange(8.0) / 8, beta=0, alpha=2),
    "non_contiguous": lambda a: a.t().contiguous() @ torch.ones(6, 3),
}


@pytest.mark.parametrize("name", list(TRAIN))
def test_op_training_step_matches_cpu(name):
    _train_check(TRAIN[name], X)


def test_batchnorm1d_2d_training_step_updates_running_stats():
    import copy
    torch.manual_seed(3)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 5)
            self.bn = torch.nn.BatchNorm1d(5)

        def forward(self, x):
            y = self.bn(self.fc(x))
            return y, poptorch.identity_loss((y ** 2).mean() + y.mean(), "none")
    m = M()
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    y_ref, l_ref = ref(X)
    opt.zero_grad()
    l_ref.backward()
    opt.step()
    pm = poptorch.trainingModel(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    y, loss = pm(X)
    torch.testing.assert_close(y, y_ref.detach(), rtol=1e-5, atol=1e-5)
    pm.copyWeightsToHost()
    for name in ("fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"):
        torch.testing.assert_close(m.state_dict()[name], ref.state_dict()[name], rtol=1e-5, atol=1e-6, msg=name)


def test_bilinear_functional_and_trilinear():
    torch.manual_seed(5)
    a, b, w = torch.randn(4, 3), torch.randn(4, 5), torch.randn(2, 3, 5)
    _check(lambda u, v, k: torch.nn.functional.bilinear(u, v, k, torch.tensor([0.5, -1.0])), a, b, w)
    # aten::_trilinear as F.bilinear calls it (i1 [N, I], w [O, I, J], i2 [N, J]) and another layout
    i1, i2 = torch.randn(4, 3), torch.randn(4, 5)
    _check(lambda p, q, r: torch.ops.aten._trilinear(p, q, r, [1, 3], [0], [1, 2], [2, 3], 1), i1, w, i2)
    _check(lambda p, q, r: torch.ops.aten._trilinear(p, q, r, [1], [0], [], [2], 1),
           torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 2, 4))


def test_bucketize_and_searchsorted():
    bounds = torch.tensor([-1.0, -0.25, 0.0, 0.5, 1.5])
    _check(lambda a: torch.bucketize(a, bounds), X, exact=True)
    _check(lambda a: torch.bucketize(a, bounds, right=True), torch.tensor([[-1.0, 0.0, 0.5], [1.5, 2.0, -3.0]]),
           exact=True)
    _check(lambda a: torch.bucketize(a, bounds, out_int32=True), X, exact=True)


@pytest.mark.parametrize("fn", [lambda a: torch.zeros(2, 3, dtype=torch.int32) + a.sum().int(),
                                lambda a: torch.ones((4,)) * a[0, 0],
                                lambda a: torch.full((2, 1, 3), 7.0) + a[:2, :3].unsqueeze(1),
                                lambda a: torch.full([3], 2, dtype=torch.long) * 3,
                                lambda a: torch.zeros_like(a[:, :5]) - 1,
                                lambda a: a.new_ones((2, 2)) + a.new_zeros(2, 1) + a.new_full((1, 2), 3.0)],
                         ids=["zeros_int", "ones_1d", "full_3d", "full_long", "zeros_like", "new_"])
def test_fills_have_the_asked_shape(fn):
    class M(torch.nn.Module):
        def forward(self, a):
            return fn(a)
    ref = fn(X)
    out = poptorch.inferenceModel(M())(X)
    assert out.shape == ref.shape
    torch.testing.assert_close(out.to(ref.dtype), ref)


def test_trilinear_training_step():
    w = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(6))
    _train_check(lambda a: torch.ops.aten._trilinear(a[:3, :4], a[3:5, 4:], w, [1], [0], [], [2], 1), X)
