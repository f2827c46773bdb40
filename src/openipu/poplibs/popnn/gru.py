"""``popnn::gru``: a basic GRU layer, forward, backward and weight update (PopLibs
``include/popnn/Gru.hpp``, ``GruDef.hpp``).

Cell, for each step with ``act = params.activation`` (TANH), ``rec = params.recurrentActivation``
(SIGMOID) (PopLibs' formulas)::

    r = rec(x W_r + h U_r + b_r)        u = rec(x W_u + h U_u + b_u)
    c = act(x W_c + (r * h) U_c + b_c)                       (resetAfter = False, default)
    c = act(x W_c + b_c + r * (h U_c + b'_c))                (resetAfter = True: torch.nn.GRU)
    h' = u * h + (1 - u) * c

Tensors: input ``[T, B, inputSize]``; ``GruWeights.inputWeights`` ``[3, in, out]``,
``outputWeights`` ``[3, out, out]``, ``biases`` ``[3, out]``, or ``[3, 2, out]`` with
``resetAfter`` (``[:, 0]`` the input biases, ``[:, 1]`` the recurrent biases), their outer
dimension in ``params.cellOrder`` (default ``[RESET_GATE, UPDATE_GATE, CANDIDATE]``, PopLibs'
``getDefaultBasicGruCellOrder``, the same as torch.nn.GRU's r, z, n). ``x W`` multiplies on the
right: ``inputWeights[u]`` is torch's ``weight_ih`` block transposed. Without ``resetAfter`` the
single bias is torch's ``b_ih + b_hh`` for the reset and update gates.

Forward intermediates ``[T, 3 (+1) (+1), B, out]``: reset gate, update gate, candidate, the
output when ``outputFullSequence`` is false, and with ``resetAfter`` the candidate's recurrent
term ``h U_c + b'_c`` (PopLibs ``getFwdIntermediatesToSave``). Backward intermediates
``[T, 3, B, out]`` (``[T, 4, B, out]`` with ``resetAfter``): the gradients of the reset, update and
candidate pre-activations (and of the candidate's recurrent term).

Out-parameters and options as in :mod:`openipu.poplibs.popnn.lstm` (``preCalcWeights`` is an
LSTM option; the GRU accepts and ignores it). Structure per step (see
:mod:`openipu.poplibs.popnn.rnn`): without ``resetAfter``, a matMul ``[B, in + out] x
[in + out, 2 out]`` for the gates, a multiply by the reset gate, then ``[B, in + out] x [in + out,
out]`` for the candidate, as PopLibs does; with ``resetAfter`` two matMuls ``[B, in] x [in, 3 out]``
and ``[B, out] x [out, 3 out]``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import poplin
from openipu.poplibs.popnn import rnn as R
from openipu.poplibs.popnn._common import poplibs_error
from openipu.poplibs.popnn.non_linearity import (NonLinearityType, _as_type, nonLinearityInPlace,
                                                 nonLinearityInputGradient)

__all__ = ["BasicGruCellUnit", "BASIC_GRU_CELL_RESET_GATE", "BASIC_GRU_CELL_UPDATE_GATE", "BASIC_GRU_CELL_CANDIDATE",
           "BASIC_GRU_CELL_NUM_UNITS", "getDefaultBasicGruCellOrder", "GruParams", "GruWeights", "createInput",
           "createInitialState", "createWeightsKernel", "createWeightsBiases", "createWeights", "gruFwd", "gruBwd",
           "gruWU", "gruBwdWithWU", "getBasicGruCellFwdFlops", "getBasicGruCellBwdFlops", "getBasicGruCellWuFlops"]


class BasicGruCellUnit(enum.IntEnum):
    """``BasicGruCellUnit`` (``GruDef.hpp``)."""

    BASIC_GRU_CELL_RESET_GATE = 0
    BASIC_GRU_CELL_UPDATE_GATE = 1
    BASIC_GRU_CELL_CANDIDATE = 2


BASIC_GRU_CELL_RESET_GATE = BasicGruCellUnit.BASIC_GRU_CELL_RESET_GATE
BASIC_GRU_CELL_UPDATE_GATE = BasicGruCellUnit.BASIC_GRU_CELL_UPDATE_GATE
BASIC_GRU_CELL_CANDIDATE = BasicGruCellUnit.BASIC_GRU_CELL_CANDIDATE
BASIC_GRU_CELL_NUM_UNITS = 3
_R, _U, _C = 0, 1, 2


def getDefaultBasicGruCellOrder():  # noqa: N802
    """``[RESET_GATE, UPDATE_GATE, CANDIDATE]`` (PopLibs' default gate order)."""
    return [BASIC_GRU_CELL_RESET_GATE, BASIC_GRU_CELL_UPDATE_GATE, BASIC_GRU_CELL_CANDIDATE]


class GruParams:
    """``popnn::gru::GruParams(dataType, batchSize, timeSteps, layerSizes, activation=TANH,
    recurrentActivation=SIGMOID)``; ``layerSizes = [inputSize, outputSize]``. Fields as PopLibs:
    ``rnn``, ``dataType``, ``batchSize``, ``timeSteps``, ``layerSizes``, ``outputFullSequence``
    (True), ``calcInputGradients`` (True), ``cellOrder``, ``resetAfter`` (False), ``activation``,
    ``recurrentActivation``. Validated by each op (``poplibs_error``)."""

    def __init__(self, dataType, batchSize, timeSteps, layerSizes,  # noqa: N803
                 activation=NonLinearityType.TANH, recurrentActivation=NonLinearityType.SIGMOID):  # noqa: N803
        self.rnn = R.RnnParams(dataType, batchSize, timeSteps, layerSizes)
        self.dataType, self.batchSize = self.rnn.dataType, batchSize
        self.timeSteps, self.layerSizes = timeSteps, self.rnn.layerSizes
        self.outputFullSequence = True
        self.calcInputGradients = True
        self.cellOrder = getDefaultBasicGruCellOrder()
        self.resetAfter = False
        self.activation = activation
        self.recurrentActivation = recurrentActivation

    def __repr__(self):
        return (f"GruParams({self.dataType}, batchSize={self.batchSize}, timeSteps={self.timeSteps}, "
                f"layerSizes={self.layerSizes}, resetAfter={self.resetAfter})")


@dataclass
class GruWeights:
    """``popnn::gru::GruWeights``: ``inputWeights`` ``[3, in, out]``, ``outputWeights``
    ``[3, out, out]``, ``biases`` ``[3, out]`` (``[3, 2, out]`` with resetAfter), or their
    gradients; units in ``cellOrder``."""

    inputWeights: poplar.Tensor  # noqa: N815
    outputWeights: poplar.Tensor  # noqa: N815
    biases: poplar.Tensor


def _validate(params, what):
    if not isinstance(params, GruParams):
        raise poplibs_error(f"{what}: params must be a gru.GruParams, got {type(params).__name__}")
    R.validate(params, "GRU", list(BasicGruCellUnit), what)


def _sizes(params):
    return int(params.timeSteps), int(params.batchSize), int(params.layerSizes[0]), int(params.layerSizes[1])


def _bias_shape(params):
    O = int(params.layerSizes[1])
    return [3, 2, O] if params.resetAfter else [3, O]


def _check_weights(params, weights, what):
    T, B, I, O = _sizes(params)
    dt = params.dataType
    if not isinstance(weights, GruWeights):
        raise poplibs_error(f"{what}: weights must be a gru.GruWeights, got {type(weights).__name__}")
    R.check_tensor(weights.inputWeights, [3, I, O], dt, what, "weights.inputWeights")
    R.check_tensor(weights.outputWeights, [3, O, O], dt, what, "weights.outputWeights")
    R.check_tensor(weights.biases, _bias_shape(params), dt, what, "weights.biases")


def _canonical(params, t):
    order = [int(u) for u in params.cellOrder]
    return R.units_view(t, [order.index(u) for u in range(3)])


def _to_cell_order(params, t):
    return R.units_view(t, [int(u) for u in params.cellOrder])


def _n_fwd_inter(params):
    return 3 + (0 if params.outputFullSequence else 1) + (1 if params.resetAfter else 0)


# -- creation -------------------------------------------------------------------------------------
def createInput(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[T, B, inputSize]`` input, each step's slice columns on one tile (``popnn::gru::createInput``)."""
    what = debug_name or "gru/createInput"
    _validate(params, what)
    R.parse_options(options, what)
    T, B, I, O = _sizes(params)
    return R.seq_tensor(graph, params.dataType, [T, B, I], debug_name or "gru/input")


def createInitialState(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[B, outputSize]`` initial output, mapped linearly (``popnn::gru::createInitialState``)."""
    _validate(params, debug_name or "gru/createInitialState")
    T, B, I, O = _sizes(params)
    return R.linear_var(graph, params.dataType, [B, O], (debug_name or "gru") + "/initialState")


def createWeightsKernel(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``(inputWeights [3, in, out], outputWeights [3, out, out])``, mapped linearly [A]."""
    what = debug_name or "gru/createWeights"
    _validate(params, what)
    R.parse_options(options, what)
    T, B, I, O = _sizes(params)
    return (R.linear_var(graph, params.dataType, [3, I, O], what + "/inputWeights"),
            R.linear_var(graph, params.dataType, [3, O, O], what + "/outputWeights"))


def createWeightsBiases(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[3, out]`` biases, or ``[3, 2, out]`` with ``resetAfter`` (``popnn::gru::createWeightsBiases``)."""
    what = debug_name or "gru/createWeights"
    _validate(params, what)
    return R.linear_var(graph, params.dataType, _bias_shape(params), what + "/biases")


def createWeights(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """:class:`GruWeights` (``popnn::gru::createWeights``)."""
    iw, ow = createWeightsKernel(graph, params, debug_name, options, cache)
    return GruWeights(iw, ow, createWeightsBiases(graph, params, debug_name, options, cache))


def getBasicGruCellFwdFlops(params) -> int:  # noqa: N802
    """Forward flops: 2 per MAC of the ``[B, in + out] x [in + out, 3 out]`` products per step plus
    ~12 element-wise flops per output element."""
    T, B, I, O = _sizes(params)
    return T * (2 * B * (I + O) * 3 * O + 12 * B * O)


def getBasicGruCellBwdFlops(params) -> int:  # noqa: N802
    """Backward flops: the gradient products ``[B, 3 out] x [3 out, (in +) out]`` and ~16
    element-wise flops per output element per step."""
    T, B, I, O = _sizes(params)
    return T * (2 * B * 3 * O * (O + I * int(params.calcInputGradients)) + 16 * B * O)


def getBasicGruCellWuFlops(params) -> int:  # noqa: N802
    """Weight-update flops: ``[in + out, T B] x [T B, 3 out]`` and the bias sums."""
    T, B, I, O = _sizes(params)
    return 2 * (I + O) * T * B * 3 * O + T * B * 3 * O * (2 if params.resetAfter else 1)


# -- forward ------------------------------------------------------------------------------------------
def _fwd(graph, params, state, in_, weights, want_inter, prog, name, options):
    from openipu.poplibs import popops
    from openipu.poplibs.popops import expr as E
    _validate(params, name)
    opts = R.parse_options(options, name)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    R.check_tensor(state, [B, O], dt, name, "stateInit")
    _check_weights(params, weights, name)
    R.check_tensor(in_, [T, B, I], dt, name, "in")
    act, rec = _as_type(params.activation), _as_type(params.recurrentActivation)
    mmo = R.mm_options(opts)
    Wi = _canonical(params, weights.inputWeights)       # [3, I, O]
    Wo = _canonical(params, weights.outputWeights)      # [3, O, O]
    bias = _canonical(params, weights.biases)
    full, ra = bool(params.outputFullSequence), bool(params.resetAfter)
    h = R.linear_var(graph, dt, [B, O], f"{name}/output")
    prog.add(P.Copy(state, h))
    out_seq = R.seq_tensor(graph, dt, [T, B, O], f"{name}/outputSeq") if full else None
    inter = R.seq_tensor(graph, dt, [T, _n_fwd_inter(params), B, O], f"{name}/intermediates") if want_inter else None
    if ra:
        Wi_flat, Wo_flat = R.flatten_units(Wi), R.flatten_units(Wo)
    else:
        W_ru = poplar.concat([R.flatten_units(Wi.slice(0, 2, 0)), R.flatten_units(Wo.slice(0, 2, 0))], 0)
        W_c = poplar.concat([Wi[_C], Wo[_C]], 0)                           # [I+O, O]

    def body(idx):
        s = P.Sequence()
        x_t = popops.dynamicSlice(graph, in_, idx, [0], [1], s, f"{name}/sliceInput").reshape([B, I])
        ghc = None
        if not ra:
            ru = R.gates_view(poplin.matMul(graph, poplar.concat([x_t, h], 1), W_ru, s, f"{name}/gateWeights",
                                            options=mmo), 2)
            popops.addInPlace(graph, ru, bias.slice(0, 2, 0).expand([1]), s, f"{name}/addGateBias")
            nonLinearityInPlace(graph, rec, ru, s, f"{name}/gates")
            r, u = ru[0], ru[1]
            rh = popops.mul(graph, r, h, s, f"{name}/resetGateXOutput")
            c = poplin.matMul(graph, poplar.concat([x_t, rh], 1), W_c, s, f"{name}/candidateWeights", options=mmo)
            popops.addInPlace(graph, c, bias[_C].expand([0]), s, f"{name}/addCandidateBias")
        else:
            gx = R.gates_view(poplin.matMul(graph, x_t, Wi_flat, s, f"{name}/inputWeights", options=mmo), 3)
            gh = R.gates_view(poplin.matMul(graph, h, Wo_flat, s, f"{name}/outputWeights", options=mmo), 3)
            popops.addInPlace(graph, R.stack([gx, gh]), bias.dimShuffle([1, 0, 2]).expand([2]), s,
                              f"{name}/addBias")
            ru = popops.add(graph, gx.slice(0, 2, 0), gh.slice(0, 2, 0), s, f"{name}/gatesSum")
            nonLinearityInPlace(graph, rec, ru, s, f"{name}/gates")
            r, u, ghc = ru[0], ru[1], gh[_C]
            c = popops.map(graph, E._1 + E._2 * E._3, [gx[_C], r, ghc], s, f"{name}/candidateSum")
        nonLinearityInPlace(graph, act, c, s, f"{name}/candidate")
        h_new = popops.map(graph, E._1 + E._2 * (E._3 - E._1), [c, u, h], s, f"{name}/CalcNextOutput")
        if inter is not None:
            parts = [r, u, c] + ([] if full else [h_new]) + ([ghc] if ra else [])
            popops.dynamicUpdate(graph, inter, R.stack(parts).expand([0]), idx, [0], [1], s,
                                 f"{name}/saveIntermediates")
        if out_seq is not None:
            popops.dynamicUpdate(graph, out_seq, h_new.expand([0]), idx, [0], [1], s, f"{name}/saveOutput")
        s.add(P.Copy(h_new, h))
        return s

    prog.add(R.time_loop(graph, T, body, False, f"{name}/timeLoop"))
    return (out_seq if full else h), inter


def gruFwd(graph, params, stateInit, in_, weights, intermediates, fwdProg, debug_name: str = "",  # noqa: N802,N803
           options=None, cache=None):
    """Run a GRU over the sequence (``popnn::gru::gruFwd``).

    ``stateInit`` ``[B, out]``, ``in_`` ``[T, B, in]``. Returns the output ``[T, B, out]``
    (``[B, out]``, the last step, when ``params.outputFullSequence`` is false); with
    ``intermediates=True`` returns ``(output, intermediates)`` (``[T, 3(+1)(+1), B, out]``, see
    the module docstring) for :func:`gruBwd`.

    Raises:
        poplibs_error: invalid params, or a tensor whose shape or type does not match them
            (variable ``realTimeSteps`` tensors are not supported).
        poplar.invalid_option: an unknown option or bad option value.
    The graph and program are unchanged when it raises.
    """
    name = debug_name or "gru"
    if isinstance(weights, poplar.Tensor):
        raise poplibs_error(f"{name}: the realTimeSteps overload of gruFwd is not supported; pass "
                            "(graph, params, stateInit, in, weights, intermediates, prog)")
    if not isinstance(fwdProg, P.Sequence):
        raise poplibs_error(f"{name}: fwdProg must be a program Sequence, got {type(fwdProg).__name__}")
    out, inter = _fwd(graph, params, stateInit, in_, weights, bool(intermediates), fwdProg, name, options)
    return (out, inter) if intermediates else out


# -- backward -------------------------------------------------------------------------------------------
def _check_bwd(params, init, fwd_inter, weights, in_, output, what):
    _validate(params, what)
    R.validate_bwd(params, "GRU", what)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    R.check_tensor(init, [B, O], dt, what, "fwdOutputInit")
    _check_weights(params, weights, what)
    R.check_tensor(in_, [T, B, I], dt, what, "input")
    R.check_tensor(output, [T, B, O] if params.outputFullSequence else [B, O], dt, what, "output")
    R.check_tensor(fwd_inter, [T, _n_fwd_inter(params), B, O], dt, what, "fwdIntermediates")


def _h_prev_seq(params, init, fwd_inter, output):
    """``[T, B, out]`` view: the output before each step."""
    T = int(params.timeSteps)
    if params.outputFullSequence:
        outs = output
    else:
        outs = fwd_inter[:, 3]
    if T == 1:
        return init.expand([0])
    return poplar.concat([init.expand([0]), outs.slice(0, T - 1, 0)], 0)


def _bwd(graph, params, prog, init, fwd_inter, weights, in_, output, out_grad, want_in_grad, want_bwd_inter,
         name, options):
    from openipu.poplibs import popops
    from openipu.poplibs.popops import expr as E
    _check_bwd(params, init, fwd_inter, weights, in_, output, name)
    opts = R.parse_options(options, name)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    full, ra = bool(params.outputFullSequence), bool(params.resetAfter)
    R.check_tensor(out_grad, [T, B, O] if full else [B, O], dt, name, "outputGrad")
    act, rec = _as_type(params.activation), _as_type(params.recurrentActivation)
    mmo = R.mm_options(opts)
    want_in_grad = bool(want_in_grad) and bool(params.calcInputGradients)
    Wi = _canonical(params, weights.inputWeights)
    Wo = _canonical(params, weights.outputWeights)
    dh = R.linear_var(graph, dt, [B, O], f"{name}/outputGrad")
    popops.zero(graph, dh, prog, f"{name}/zeroOutputGrad")
    if full:
        gseq = out_grad
    else:
        gseq = R.seq_tensor(graph, dt, [T, B, O], f"{name}/outputGradSeq")
        popops.zero(graph, gseq, prog, f"{name}/zeroOutputGradSeq")
        prog.add(P.Copy(out_grad, gseq[T - 1]))
    hp_seq = _h_prev_seq(params, init, fwd_inter, output)
    in_grad = R.seq_tensor(graph, dt, [T, B, I], f"{name}/inputGrad") if want_in_grad else None
    n_bwd = 4 if ra else 3
    bwd_inter = R.seq_tensor(graph, dt, [T, n_bwd, B, O], f"{name}/bwdIntermediates") if want_bwd_inter else None

    def nl_grad(nl, out, grad, s, nm):
        return nonLinearityInputGradient(graph, nl, out, grad, s, nm)

    def body(idx):
        s = P.Sequence()
        it = popops.dynamicSlice(graph, fwd_inter, idx, [0], [1], s, f"{name}/sliceIntermediates")[0]
        r, u, c = it[0], it[1], it[2]
        hp = popops.dynamicSlice(graph, hp_seq, idx, [0], [1], s, f"{name}/slicePrevOutput")[0]
        g_t = popops.dynamicSlice(graph, gseq, idx, [0], [1], s, f"{name}/sliceOutputGrad")[0]
        dh_tot = popops.add(graph, g_t, dh, s, f"{name}/outputGradSum")
        du_up = popops.map(graph, E._1 * (E._2 - E._3), [dh_tot, hp, c], s, f"{name}/updateGateGrad/in")
        dc_up = popops.map(graph, E._1 - E._1 * E._2, [dh_tot, u], s, f"{name}/candidateGrad/in")
        if act == rec:
            d_uc = nl_grad(act, R.stack([u, c]), R.stack([du_up, dc_up]), s, f"{name}/gatesGrad")
            du, dc = d_uc[0], d_uc[1]
        else:
            du = nl_grad(rec, u, du_up, s, f"{name}/updateGateGrad")
            dc = nl_grad(act, c, dc_up, s, f"{name}/candidateGrad")
        if not ra:
            Wc = (poplar.concat([Wi[_C], Wo[_C]], 0) if want_in_grad else Wo[_C]).transpose()   # [O, (I+)O]
            off = I if want_in_grad else 0
            m1 = poplin.matMul(graph, dc, Wc, s, f"{name}/candidateInputGrads", options=mmo)
            drh = m1.slice(off, off + O, 1)
            dr_up = popops.mul(graph, drh, hp, s, f"{name}/resetGateGrad/in")
            dr = nl_grad(rec, r, dr_up, s, f"{name}/resetGateGrad")
            Dru = R.stack([dr, du])
            Wru = (poplar.concat([R.flatten_units(Wi.slice(0, 2, 0)), R.flatten_units(Wo.slice(0, 2, 0))], 0)
                   if want_in_grad else R.flatten_units(Wo.slice(0, 2, 0))).transpose()    # [2O, (I+)O]
            m2 = poplin.matMul(graph, Dru.dimShuffle([1, 0, 2]).reshape([B, 2 * O]), Wru, s,
                               f"{name}/gateInputGrads", options=mmo)
            popops.mapWithOutput(graph, E._1 * E._2 + E._3 * E._4 + E._5,
                                 [dh_tot, u, drh, r, m2.slice(off, off + O, 1)], dh, s, f"{name}/prevOutputGrad")
            D = R.stack([dr, du, dc])
            if in_grad is not None:
                dx = popops.add(graph, m1.slice(0, I, 1), m2.slice(0, I, 1), s, f"{name}/inputGradSum")
        else:
            ghc = it[_n_fwd_inter(params) - 1]
            dr_up = popops.mul(graph, dc, ghc, s, f"{name}/resetGateGrad/in")
            dr = nl_grad(rec, r, dr_up, s, f"{name}/resetGateGrad")
            dghc = popops.mul(graph, dc, r, s, f"{name}/candidateRecurrentGrad")
            Dh = R.stack([dr, du, dghc])
            mh = poplin.matMul(graph, Dh.dimShuffle([1, 0, 2]).reshape([B, 3 * O]),
                               R.flatten_units(Wo).transpose(), s, f"{name}/outputWeightsGrads", options=mmo)
            popops.mapWithOutput(graph, E._1 * E._2 + E._3, [dh_tot, u, mh], dh, s, f"{name}/prevOutputGrad")
            D = R.stack([dr, du, dc, dghc])
            if in_grad is not None:
                dx = poplin.matMul(graph, D.slice(0, 3, 0).dimShuffle([1, 0, 2]).reshape([B, 3 * O]),
                                   R.flatten_units(Wi).transpose(), s, f"{name}/inputWeightsGrads", options=mmo)
        if in_grad is not None:
            popops.dynamicUpdate(graph, in_grad, dx.expand([0]), idx, [0], [1], s, f"{name}/saveInputGrad")
        if bwd_inter is not None:
            popops.dynamicUpdate(graph, bwd_inter, D.expand([0]), idx, [0], [1], s, f"{name}/saveGateGrads")
        return s

    prog.add(R.time_loop(graph, T, body, True, f"{name}/timeLoop"))
    return dh, in_grad, bwd_inter


def gruBwd(graph, params, prog, fwdOutputInit, fwdIntermediatesSeq, weights, fwdInputSeq, fwdOutput,  # noqa: N802,N803
           gradLayerNext, inputGrad=True, bwdIntermediates=False, debug_name: str = "", options=None,  # noqa: N803
           cache=None):
    """GRU backward pass over the steps in reverse (``popnn::gru::gruBwd``).

    ``gradLayerNext`` has the shape of ``fwdOutput``. ``inputGrad`` / ``bwdIntermediates``: whether
    to compute the input gradients ``[T, B, in]`` and keep the gate gradients (for :func:`gruWU`).
    Returns ``(initOutputGrad [B, out], inputGrad, bwdIntermediates)`` (None for what was not
    requested, or inputs when ``params.calcInputGradients`` is false).

    Raises ``poplibs_error`` for invalid params, mismatched tensors, or activations other than
    SIGMOID, TANH, RELU; ``poplar.invalid_option``. The graph is unchanged when it raises.
    """
    return _bwd(graph, params, prog, fwdOutputInit, fwdIntermediatesSeq, weights, fwdInputSeq, fwdOutput,
                gradLayerNext, inputGrad, bwdIntermediates, debug_name or "gruBwd", options)


def _wu(graph, params, prog, init, fwd_inter, bwd_inter, weights, in_, output, name, options):
    from openipu.poplibs import popops
    _check_bwd(params, init, fwd_inter, weights, in_, output, name)
    opts = R.parse_options(options, name)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    ra = bool(params.resetAfter)
    R.check_tensor(bwd_inter, [T, 4 if ra else 3, B, O], dt, name, "bwdIntermediates")
    mmo = R.mm_options(opts)
    X = in_.reshape([T * B, I])
    hp_seq = _h_prev_seq(params, init, fwd_inter, output)
    Hp = hp_seq.reshape([T * B, O])

    def rows(units):     # [T, U, B, O] -> [T B, U O]
        return units.dimShuffle([0, 2, 1, 3]).reshape([T * B, units.dim(1) * O])

    def bias_sum(D, nm):
        return popops.reduce(graph, D, [0], popops.ReduceParams(popops.Operation.ADD), prog, nm)

    if not ra:
        RH = popops.mul(graph, fwd_inter[:, 0], hp_seq, prog, f"{name}/resetGateXPrevOutput").reshape([T * B, O])
        D_ru, D_c = rows(bwd_inter.slice(0, 2, 1)), rows(bwd_inter.slice(2, 3, 1))
        dW_ru = poplin.matMul(graph, poplar.concat([X, Hp], 1).transpose(), D_ru, prog, f"{name}/gateWeightGrads",
                              options=mmo)                                     # [I+O, 2O]
        dW_c = poplin.matMul(graph, poplar.concat([X, RH], 1).transpose(), D_c, prog,
                             f"{name}/candidateWeightGrads", options=mmo)       # [I+O, O]
        dW = poplar.concat([dW_ru, dW_c], 1)                                    # [I+O, 3O]
        db = bias_sum(rows(bwd_inter), f"{name}/biasGrads")                    # [3O]
        dWin, dWout = dW.slice(0, I, 0), dW.slice(I, I + O, 0)
        db_shape = [3, O]
    else:
        D_x = rows(bwd_inter.slice(0, 3, 1))
        D_h = rows(poplar.concat([bwd_inter.slice(0, 2, 1), bwd_inter.slice(3, 4, 1)], 1))
        dWin = poplin.matMul(graph, X.transpose(), D_x, prog, f"{name}/inputWeightGrads", options=mmo)
        dWout = poplin.matMul(graph, Hp.transpose(), D_h, prog, f"{name}/outputWeightGrads", options=mmo)
        db = bias_sum(poplar.concat([D_x, D_h], 1), f"{name}/biasGrads")        # [6O]: input then recurrent
        db_shape = None
    wat = opts.get("weightAccumulatorsType")
    if wat is not None and poplar.types.as_type(wat) != dt:
        wt = poplar.types.as_type(wat)
        dWin = popops.cast(graph, dWin, wt, prog, f"{name}/castInputWeightGrads")
        dWout = popops.cast(graph, dWout, wt, prog, f"{name}/castOutputWeightGrads")
        db = popops.cast(graph, db, wt, prog, f"{name}/castBiasGrads")
    if db_shape is not None:
        dbias = db.reshape(db_shape)
    else:
        dbias = db.reshape([2, 3, O]).dimShuffle([1, 0, 2])                      # [3, 2, O]
    return GruWeights(_to_cell_order(params, R.unflatten_units(dWin, 3)),
                      _to_cell_order(params, R.unflatten_units(dWout, 3)), _to_cell_order(params, dbias))


def gruWU(graph, params, prog, fwdOutputInit, fwdIntermediates, bwdIntermediates, weights, input,  # noqa: N802,N803,A002
          output, debug_name: str = "", options=None, cache=None):
    """Weight gradients from the forward and backward intermediates (``popnn::gru::gruWU``): matMuls
    over the whole sequence (``[in + out, T B] x [T B, units x out]``) and a bias ``reduce``.
    Returns a :class:`GruWeights` of gradients (units in ``params.cellOrder``). Raises as
    :func:`gruBwd`."""
    return _wu(graph, params, prog, fwdOutputInit, fwdIntermediates, bwdIntermediates, weights, input, output,
               debug_name or "gruWU", options)


def gruBwdWithWU(graph, params, prog, fwdOutputInit, fwdIntermediates, weights, input, output,  # noqa: N802,N803,A002
                 outputGrad, inputGrad=True, debug_name: str = "", options=None, cache=None):  # noqa: N803
    """Backward pass and weight update (``popnn::gru::gruBwdWithWU``). Returns
    ``(initOutputGrad [B, out], inputGrad [T, B, in] or None, weightsGrad GruWeights)``.
    Raises as :func:`gruBwd`."""
    name = debug_name or "gruBwdWithWU"
    _check_bwd(params, fwdOutputInit, fwdIntermediates, weights, input, output, name)
    R.parse_options(options, name)
    dh, in_grad, bwd_inter = _bwd(graph, params, prog, fwdOutputInit, fwdIntermediates, weights, input, output,
                                  outputGrad, inputGrad, True, name, options)
    wg = _wu(graph, params, prog, fwdOutputInit, fwdIntermediates, bwd_inter, weights, input, output,
             f"{name}/WU", options)
    return dh, in_grad, wg
