"""``popnn::lstm``: a basic LSTM layer, forward, backward and weight update (PopLibs
``include/popnn/Lstm.hpp``, ``LstmDef.hpp``).

Cell (no peepholes), for each step ``t`` with ``act = params.activation`` (TANH) and
``rec = params.recurrentActivation`` (SIGMOID)::

    f = rec(x W_f + h U_f + b_f)      i = rec(x W_i + h U_i + b_i)
    g = act(x W_c + h U_c + b_c)      o = rec(x W_o + h U_o + b_o)
    c' = f * c + i * g                h' = o * act(c')

Tensors: input ``[T, B, inputSize]``; ``LstmWeights.inputWeights`` ``[4, inputSize, outputSize]``,
``outputWeights`` ``[4, outputSize, outputSize]``, ``biases`` ``[4, outputSize]`` (one bias per
unit: torch's ``b_ih + b_hh``), their outer dimension in ``params.cellOrder`` (default
``[FORGET_GATE, INPUT_GATE, CANDIDATE, OUTPUT_GATE]``, PopLibs' ``getDefaultBasicLstmCellOrder``;
torch.nn.LSTM's order is input, forget, candidate, output). Note ``x W`` multiplies on the right:
PopLibs' ``inputWeights[u]`` is torch's ``weight_ih`` block transposed.

Forward intermediates ``[T, 6 (+1), B, outputSize]``: forget gate, input gate, candidate,
output gate, ``act(c')``, the previous cell state (PopLibs ``LSTM_FWD_INTERMEDIATE_*``), plus the
step output when ``outputFullSequence`` is false. Backward intermediates ``[T, 4, B, outputSize]``:
the gradients of the four units' pre-activations in the order forget, input, candidate, output.

Python-isation of PopLibs' out-parameters (``Tensor *intermediates``, ``*inputGrad``,
``*bwdIntermediates``): pass ``True`` to ask for the tensor; it is returned after the
function's C++ return value (see each function). Options (``createInput`` in Lstm.hpp):
``availableMemoryProportion`` and ``partialsType`` (passed to ``poplin.matMul``),
``preCalcWeights`` (one matmul of the whole input sequence before the loop),
``weightAccumulatorsType`` (type of the weight gradients), ``inferenceOnly`` and
``recomputationMode`` (accepted; no recomputation is done).

The layer is a per-step program (see :mod:`openipu.poplibs.popnn.rnn`): per forward step one
``DynamicSlice2D`` of the input, one ``matMul`` ``[B, in + out] x [in + out, 4 out]`` (or
``[B, out] x [out, 4 out]`` plus an add with ``preCalcWeights``), a bias add, the gate
non-linearities (``NonLinearity1D``), two generated maps and one non-linearity for the cell and
output, and ``DynamicUpdateSlice2D`` writes of the output and intermediates; the backward step
adds the non-linearity gradients (``NonLinearityGrad1D``) and one ``matMul`` ``[B, 4 out] x
[4 out, in + out]``. The flops of :func:`getBasicLstmCellFwdFlops` etc. are PopLibs' counts
(2 per MAC of the matmuls plus the element-wise work).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import poplin
from openipu.poplibs.popnn import rnn as R
from openipu.poplibs.popnn._common import poplibs_error
from openipu.poplibs.popnn.non_linearity import (NonLinearityType, _as_type, nonLinearity, nonLinearityInPlace,
                                                 nonLinearityInputGradient)

__all__ = ["BasicLstmCellUnit", "BASIC_LSTM_CELL_FORGET_GATE", "BASIC_LSTM_CELL_INPUT_GATE",
           "BASIC_LSTM_CELL_CANDIDATE", "BASIC_LSTM_CELL_OUTPUT_GATE", "BASIC_LSTM_CELL_NUM_UNITS",
           "getDefaultBasicLstmCellOrder", "LstmParams", "LstmState", "LstmWeights", "createInput",
           "createInitialOutput", "createInitialCellState", "createInitialState", "zeroInitialState",
           "createWeightsKernel", "createWeightsBiases", "createWeights", "lstmFwd", "lstmBwd", "lstmWU",
           "lstmBwdWithWU", "getBasicLstmCellFwdFlops", "getBasicLstmCellBwdFlops", "getBasicLstmCellWuFlops"]


class BasicLstmCellUnit(enum.IntEnum):
    """``BasicLstmCellUnit`` (``LstmDef.hpp``)."""

    BASIC_LSTM_CELL_FORGET_GATE = 0
    BASIC_LSTM_CELL_INPUT_GATE = 1
    BASIC_LSTM_CELL_CANDIDATE = 2
    BASIC_LSTM_CELL_OUTPUT_GATE = 3


BASIC_LSTM_CELL_FORGET_GATE = BasicLstmCellUnit.BASIC_LSTM_CELL_FORGET_GATE
BASIC_LSTM_CELL_INPUT_GATE = BasicLstmCellUnit.BASIC_LSTM_CELL_INPUT_GATE
BASIC_LSTM_CELL_CANDIDATE = BasicLstmCellUnit.BASIC_LSTM_CELL_CANDIDATE
BASIC_LSTM_CELL_OUTPUT_GATE = BasicLstmCellUnit.BASIC_LSTM_CELL_OUTPUT_GATE
BASIC_LSTM_CELL_NUM_UNITS = 4
_F, _I, _C, _O = 0, 1, 2, 3
_NUM_FWD_INTER = 6


def getDefaultBasicLstmCellOrder():  # noqa: N802
    """``[FORGET_GATE, INPUT_GATE, CANDIDATE, OUTPUT_GATE]`` (PopLibs' default gate order)."""
    return [BASIC_LSTM_CELL_FORGET_GATE, BASIC_LSTM_CELL_INPUT_GATE, BASIC_LSTM_CELL_CANDIDATE,
            BASIC_LSTM_CELL_OUTPUT_GATE]


class LstmParams:
    """``popnn::lstm::LstmParams(dataType, batchSize, timeSteps, layerSizes, activation=TANH,
    recurrentActivation=SIGMOID)``; ``layerSizes = [inputSize, outputSize]``.

    Fields as PopLibs: ``rnn`` (:class:`~openipu.poplibs.popnn.rnn.RnnParams`), ``dataType``,
    ``batchSize``, ``timeSteps``, ``layerSizes``, ``outputFullSequence`` (True),
    ``doInputWeightCalc`` (True), ``calcInputGradients`` (True), ``cellOrder``, ``activation``,
    ``recurrentActivation``. Validated by each op (``poplibs_error``)."""

    def __init__(self, dataType, batchSize, timeSteps, layerSizes,  # noqa: N803
                 activation=NonLinearityType.TANH, recurrentActivation=NonLinearityType.SIGMOID):  # noqa: N803
        self.rnn = R.RnnParams(dataType, batchSize, timeSteps, layerSizes)
        self.dataType, self.batchSize = self.rnn.dataType, batchSize
        self.timeSteps, self.layerSizes = timeSteps, self.rnn.layerSizes
        self.outputFullSequence = True
        self.doInputWeightCalc = True
        self.calcInputGradients = True
        self.cellOrder = getDefaultBasicLstmCellOrder()
        self.activation = activation
        self.recurrentActivation = recurrentActivation

    def __repr__(self):
        return (f"LstmParams({self.dataType}, batchSize={self.batchSize}, timeSteps={self.timeSteps}, "
                f"layerSizes={self.layerSizes}, activation={self.activation}, "
                f"recurrentActivation={self.recurrentActivation})")


@dataclass
class LstmState:
    """``popnn::lstm::LstmState``: ``output`` and ``cellState`` ``[B, outputSize]`` (or their
    gradients)."""

    output: poplar.Tensor
    cellState: poplar.Tensor  # noqa: N815

    def getAsTensor(self):  # noqa: N802
        """``[2, B, outputSize]``: output then cell state (a view)."""
        return R.stack([self.output, self.cellState])


@dataclass
class LstmWeights:
    """``popnn::lstm::LstmWeights``: ``inputWeights`` ``[4, in, out]``, ``outputWeights``
    ``[4, out, out]``, ``biases`` ``[4, out]`` (or their gradients), units in ``cellOrder``."""

    inputWeights: poplar.Tensor  # noqa: N815
    outputWeights: poplar.Tensor  # noqa: N815
    biases: poplar.Tensor


# -- validation helpers -------------------------------------------------------------------------
def _validate(params, what):
    if not isinstance(params, LstmParams):
        raise poplibs_error(f"{what}: params must be an lstm.LstmParams, got {type(params).__name__}")
    R.validate(params, "LSTM", list(BasicLstmCellUnit), what)


def _sizes(params):
    return int(params.timeSteps), int(params.batchSize), int(params.layerSizes[0]), int(params.layerSizes[1])


def _check_weights(params, weights, what):
    T, B, I, O = _sizes(params)
    dt = params.dataType
    if not isinstance(weights, LstmWeights):
        raise poplibs_error(f"{what}: weights must be an lstm.LstmWeights, got {type(weights).__name__}")
    R.check_tensor(weights.inputWeights, [4, I, O], dt, what, "weights.inputWeights")
    R.check_tensor(weights.outputWeights, [4, O, O], dt, what, "weights.outputWeights")
    R.check_tensor(weights.biases, [4, O], dt, what, "weights.biases")


def _check_state(params, state, what, name="stateInit"):
    T, B, I, O = _sizes(params)
    if not isinstance(state, LstmState):
        raise poplibs_error(f"{what}: {name} must be an lstm.LstmState, got {type(state).__name__}")
    R.check_tensor(state.output, [B, O], params.dataType, what, f"{name}.output")
    R.check_tensor(state.cellState, [B, O], params.dataType, what, f"{name}.cellState")


def _canonical(params, t):
    """``t`` (units in ``cellOrder``) viewed with units in canonical order F, I, C, O."""
    order = [int(u) for u in params.cellOrder]
    return R.units_view(t, [order.index(u) for u in range(4)])


def _to_cell_order(params, t):
    return R.units_view(t, [int(u) for u in params.cellOrder])


# -- creation -------------------------------------------------------------------------------------
def createInput(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[T, B, inputSize]`` input of ``params.dataType``, each step's slice columns on one tile
    (``popnn::lstm::createInput``). Raises ``poplibs_error`` (bad params), ``poplar.invalid_option``."""
    what = debug_name or "lstm/createInput"
    _validate(params, what)
    R.parse_options(options, what)
    T, B, I, O = _sizes(params)
    return R.seq_tensor(graph, params.dataType, [T, B, I], debug_name or "lstm/input")


def createInitialOutput(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[B, outputSize]`` initial output, mapped linearly (``popnn::lstm::createInitialOutput``)."""
    _validate(params, debug_name or "lstm/createInitialOutput")
    T, B, I, O = _sizes(params)
    return R.linear_var(graph, params.dataType, [B, O], (debug_name or "lstm") + "/initialOutput")


def createInitialCellState(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[B, outputSize]`` initial cell state, mapped linearly (``popnn::lstm::createInitialCellState``)."""
    _validate(params, debug_name or "lstm/createInitialCellState")
    T, B, I, O = _sizes(params)
    return R.linear_var(graph, params.dataType, [B, O], (debug_name or "lstm") + "/initialCellState")


def createInitialState(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """:class:`LstmState` of :func:`createInitialOutput` and :func:`createInitialCellState`."""
    return LstmState(createInitialOutput(graph, params, debug_name, options, cache),
                     createInitialCellState(graph, params, debug_name, options, cache))


def zeroInitialState(graph, initialState, prog, debug_name: str = "") -> None:  # noqa: N802,N803
    """Zero both tensors of ``initialState`` (``popnn::lstm::zeroInitialState``)."""
    from openipu.poplibs.popops.cast import zero
    if not isinstance(initialState, LstmState):
        raise poplibs_error(f"zeroInitialState: expected an lstm.LstmState, got {type(initialState).__name__}")
    zero(graph, initialState.output, prog, (debug_name or "lstm") + "/zeroOutput")
    zero(graph, initialState.cellState, prog, (debug_name or "lstm") + "/zeroCellState")


def createWeightsKernel(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``(inputWeights [4, in, out], outputWeights [4, out, out])``, mapped linearly [A]
    (PopLibs maps them as matmul right-hand sides) (``popnn::lstm::createWeightsKernel``)."""
    what = debug_name or "lstm/createWeights"
    _validate(params, what)
    R.parse_options(options, what)
    T, B, I, O = _sizes(params)
    return (R.linear_var(graph, params.dataType, [4, I, O], what + "/inputWeights"),
            R.linear_var(graph, params.dataType, [4, O, O], what + "/outputWeights"))


def createWeightsBiases(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """``[4, outputSize]`` biases, mapped linearly (``popnn::lstm::createWeightsBiases``)."""
    what = debug_name or "lstm/createWeights"
    _validate(params, what)
    T, B, I, O = _sizes(params)
    return R.linear_var(graph, params.dataType, [4, O], what + "/biases")


def createWeights(graph, params, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """:class:`LstmWeights` (``popnn::lstm::createWeights``)."""
    iw, ow = createWeightsKernel(graph, params, debug_name, options, cache)
    return LstmWeights(iw, ow, createWeightsBiases(graph, params, debug_name, options, cache))


# -- flops (PopLibs getBasicLstmCell*Flops shape) ----------------------------------------------------
def getBasicLstmCellFwdFlops(params) -> int:  # noqa: N802
    """Forward flops: 2 per MAC of ``[B, in + out] x [in + out, 4 out]`` per step, plus the
    element-wise work (bias add 4, non-linearities 5, cell and output 4 per output element)."""
    T, B, I, O = _sizes(params)
    return T * (2 * B * (I * int(params.doInputWeightCalc) + O) * 4 * O + 13 * B * O)


def getBasicLstmCellBwdFlops(params) -> int:  # noqa: N802
    """Backward flops: the gradient matmul (``[B, 4 out] x [4 out, (in +) out]``) and ~20 element-wise
    flops per output element per step."""
    T, B, I, O = _sizes(params)
    return T * (2 * B * 4 * O * (O + I * int(params.calcInputGradients)) + 20 * B * O)


def getBasicLstmCellWuFlops(params) -> int:  # noqa: N802
    """Weight-update flops: ``[in + out, T B] x [T B, 4 out]`` and the bias sums."""
    T, B, I, O = _sizes(params)
    return 2 * (I + O) * T * B * 4 * O + T * B * 4 * O


# -- forward ------------------------------------------------------------------------------------------
def _fwd(graph, params, prog, state, weights, in_, want_inter, name, options):
    from openipu.poplibs import popops
    from openipu.poplibs.popops import expr as E
    _validate(params, name)
    opts = R.parse_options(options, name)
    _check_state(params, state, name)
    _check_weights(params, weights, name)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    R.check_tensor(in_, [T, B, I], dt, name, "in")
    act, rec = _as_type(params.activation), _as_type(params.recurrentActivation)
    mmo = R.mm_options(opts)
    pre_calc = opts.get("preCalcWeights", False)
    Win = R.flatten_units(_canonical(params, weights.inputWeights))      # [I, 4O]
    Wout = R.flatten_units(_canonical(params, weights.outputWeights))    # [O, 4O]
    bias = _canonical(params, weights.biases)                            # [4, O]
    full = bool(params.outputFullSequence)
    h = R.linear_var(graph, dt, [B, O], f"{name}/output")
    c = R.linear_var(graph, dt, [B, O], f"{name}/cellState")
    prog.add(P.Copy(state.output, h))
    prog.add(P.Copy(state.cellState, c))
    out_seq = R.seq_tensor(graph, dt, [T, B, O], f"{name}/outputSeq") if full else None
    n_inter = _NUM_FWD_INTER + (0 if full else 1)
    inter = R.seq_tensor(graph, dt, [T, n_inter, B, O], f"{name}/intermediates") if want_inter else None
    xw = None
    if pre_calc:
        xw = poplin.matMul(graph, in_.reshape([T * B, I]), Win, prog, f"{name}/preCalcWeights",
                           options=mmo).reshape([T, B, 4 * O])

    def body(idx):
        s = P.Sequence()
        if pre_calc:
            xw_t = popops.dynamicSlice(graph, xw, idx, [0], [1], s, f"{name}/sliceWeightedInput").reshape([B, 4 * O])
            hw = poplin.matMul(graph, h, Wout, s, f"{name}/outputWeights", options=mmo)
            popops.addInPlace(graph, hw, xw_t, s, f"{name}/addWeightedInput")
            mm = hw
        else:
            x_t = popops.dynamicSlice(graph, in_, idx, [0], [1], s, f"{name}/sliceInput").reshape([B, I])
            mm = poplin.matMul(graph, poplar.concat([x_t, h], 1), poplar.concat([Win, Wout], 0), s,
                               f"{name}/weights", options=mmo)
        gates = R.gates_view(mm, 4)                                       # [4, B, O], canonical
        popops.addInPlace(graph, gates, bias.expand([1]), s, f"{name}/addBias")
        f, i, g, o = gates[_F], gates[_I], gates[_C], gates[_O]
        if act == rec:
            nonLinearityInPlace(graph, rec, gates, s, f"{name}/gates")
        else:
            nonLinearityInPlace(graph, rec, R.stack([f, i, o]), s, f"{name}/gates")
            nonLinearityInPlace(graph, act, g, s, f"{name}/candidate")
        c_new = popops.map(graph, E._1 * E._2 + E._3 * E._4, [f, c, i, g], s, f"{name}/cellState")
        tc = nonLinearity(graph, act, c_new, s, f"{name}/outputNonLinearity")
        h_new = popops.mul(graph, o, tc, s, f"{name}/output")
        if inter is not None:
            parts = [f, i, g, o, tc, c] + ([] if full else [h_new])
            popops.dynamicUpdate(graph, inter, R.stack(parts).expand([0]), idx, [0], [1], s,
                                 f"{name}/saveIntermediates")
        if out_seq is not None:
            popops.dynamicUpdate(graph, out_seq, h_new.expand([0]), idx, [0], [1], s, f"{name}/saveOutput")
        s.add(P.Copy(c_new, c))
        s.add(P.Copy(h_new, h))
        return s

    prog.add(R.time_loop(graph, T, body, False, f"{name}/timeLoop"))
    return (out_seq if full else h), c, inter


def lstmFwd(graph, params, *args, debug_name: str = "", options=None, cache=None):  # noqa: N802
    """Run an LSTM over the sequence (``popnn::lstm::lstmFwd``), both PopLibs overloads:

    - ``lstmFwd(graph, params, stateInit, in, weights, intermediates, fwdProg, debug_name="",
      options=None, cache=None)`` -> ``(output, finalCellState)`` (the deprecated form);
    - ``lstmFwd(graph, params, prog, stateInit, weights, in, intermediates, debug_name="",
      options=None, cache=None)`` -> ``output``.

    ``output`` is ``[T, B, outputSize]`` (``[B, outputSize]``, the last step, when
    ``params.outputFullSequence`` is false); the final cell state is ``[B, outputSize]``.
    ``intermediates``: ``None``/``False`` for inference; ``True`` to keep the forward
    intermediates ``[T, 6 (+1), B, outputSize]`` for :func:`lstmBwd`, which are then returned last
    (``(output, cellState, intermediates)`` or ``(output, intermediates)``).

    Raises:
        poplibs_error: invalid params, or a tensor whose shape or type does not match them.
        poplar.invalid_option: an unknown option or bad option value.
    The graph and program are unchanged when it raises.
    """
    args = list(args)
    if args and isinstance(args[0], P.Program):
        prog, state, weights, in_ = args[:4]
        rest = args[4:]
        new_form = True
    else:
        if len(args) < 5:
            raise poplibs_error("lstmFwd: expected (graph, params, stateInit, in, weights, intermediates, prog, ...)"
                                " or (graph, params, prog, stateInit, weights, in, intermediates, ...)")
        state, in_, weights, want, prog = args[:5]
        rest = [want] + args[5:]
        new_form = False
    want = bool(rest[0]) if rest else False
    name = (rest[1] if len(rest) > 1 else "") or debug_name or "lstm"
    options = rest[2] if len(rest) > 2 else options
    if not isinstance(prog, P.Sequence):
        raise poplibs_error(f"lstmFwd: prog must be a program Sequence, got {type(prog).__name__}")
    out, cell, inter = _fwd(graph, params, prog, state, weights, in_, want, name, options)
    res = (out,) if new_form else (out, cell)
    if want:
        res = res + (inter,)
    return res[0] if len(res) == 1 else res


# -- backward -------------------------------------------------------------------------------------------
def _check_bwd(params, init_state, fwd_inter, weights, in_, output, what):
    _validate(params, what)
    R.validate_bwd(params, "LSTM", what)
    _check_state(params, init_state, what, "fwdStateInit")
    _check_weights(params, weights, what)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    full = bool(params.outputFullSequence)
    R.check_tensor(in_, [T, B, I], dt, what, "input")
    R.check_tensor(output, [T, B, O] if full else [B, O], dt, what, "output")
    R.check_tensor(fwd_inter, [T, _NUM_FWD_INTER + (0 if full else 1), B, O], dt, what, "fwdIntermediates")


def _bwd(graph, params, prog, init_state, fwd_inter, weights, in_, output, out_grad, last_c_grad,
         want_in_grad, want_bwd_inter, name, options):
    from openipu.poplibs import popops
    from openipu.poplibs.popops import expr as E
    _check_bwd(params, init_state, fwd_inter, weights, in_, output, name)
    opts = R.parse_options(options, name)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    full = bool(params.outputFullSequence)
    R.check_tensor(out_grad, [T, B, O] if full else [B, O], dt, name, "outputGrad")
    if last_c_grad is not None:
        R.check_tensor(last_c_grad, [B, O], dt, name, "lastCellStateGrad")
    act, rec = _as_type(params.activation), _as_type(params.recurrentActivation)
    mmo = R.mm_options(opts)
    want_in_grad = bool(want_in_grad) and bool(params.calcInputGradients)
    Win = R.flatten_units(_canonical(params, weights.inputWeights))
    Wout = R.flatten_units(_canonical(params, weights.outputWeights))
    Wt = (poplar.concat([Win, Wout], 0) if want_in_grad else Wout).transpose()   # [4O, (I+)O]
    off = I if want_in_grad else 0
    dh = R.linear_var(graph, dt, [B, O], f"{name}/outputGrad")
    dc = R.linear_var(graph, dt, [B, O], f"{name}/cellStateGrad")
    popops.zero(graph, dh, prog, f"{name}/zeroOutputGrad")
    if last_c_grad is not None:
        prog.add(P.Copy(last_c_grad, dc))
    else:
        popops.zero(graph, dc, prog, f"{name}/zeroCellStateGrad")
    if full:
        gseq = out_grad
    else:
        gseq = R.seq_tensor(graph, dt, [T, B, O], f"{name}/outputGradSeq")
        popops.zero(graph, gseq, prog, f"{name}/zeroOutputGradSeq")
        prog.add(P.Copy(out_grad, gseq[T - 1]))
    in_grad = R.seq_tensor(graph, dt, [T, B, I], f"{name}/inputGrad") if want_in_grad else None
    bwd_inter = R.seq_tensor(graph, dt, [T, 4, B, O], f"{name}/bwdIntermediates") if want_bwd_inter else None

    def body(idx):
        s = P.Sequence()
        it = popops.dynamicSlice(graph, fwd_inter, idx, [0], [1], s, f"{name}/sliceIntermediates")[0]
        f, i, g, o, tc, cp = (it[k] for k in range(6))
        g_t = popops.dynamicSlice(graph, gseq, idx, [0], [1], s, f"{name}/sliceOutputGrad")[0]
        dh_tot = popops.add(graph, g_t, dh, s, f"{name}/outputGradSum")
        d_tc = popops.mul(graph, dh_tot, o, s, f"{name}/outputNonLinearityGrad/in")
        dcc = nonLinearityInputGradient(graph, act, tc, d_tc, s, f"{name}/outputNonLinearityGrad")
        dc_tot = popops.add(graph, dc, dcc, s, f"{name}/cellStateGradSum")
        up = popops.mul(graph, R.stack([dc_tot, dc_tot, dc_tot, dh_tot]), R.stack([cp, g, i, tc]), s,
                        f"{name}/gateGrads")                                          # F, I, C, O
        if act == rec:
            D = nonLinearityInputGradient(graph, rec, it.slice(0, 4, 0), up, s, f"{name}/gatesGrad")
        else:
            dr = nonLinearityInputGradient(graph, rec, R.stack([f, i, o]), R.stack([up[_F], up[_I], up[_O]]), s,
                                           f"{name}/gatesGrad")
            dg = nonLinearityInputGradient(graph, act, g, up[_C], s, f"{name}/candidateGrad")
            D = R.stack([dr[0], dr[1], dg, dr[2]])
        popops.mapWithOutput(graph, E._1 * E._2, [dc_tot, f], dc, s, f"{name}/prevCellStateGrad")
        dxh = poplin.matMul(graph, D.dimShuffle([1, 0, 2]).reshape([B, 4 * O]), Wt, s, f"{name}/inputGrads",
                            options=mmo)
        s.add(P.Copy(dxh.slice(off, off + O, 1), dh))
        if in_grad is not None:
            popops.dynamicUpdate(graph, in_grad, dxh.slice(0, I, 1).expand([0]), idx, [0], [1], s,
                                 f"{name}/saveInputGrad")
        if bwd_inter is not None:
            popops.dynamicUpdate(graph, bwd_inter, D.expand([0]), idx, [0], [1], s, f"{name}/saveGateGrads")
        return s

    prog.add(R.time_loop(graph, T, body, True, f"{name}/timeLoop"))
    return LstmState(dh, dc), in_grad, bwd_inter


def lstmBwd(graph, params, prog, fwdStateInit, fwdIntermediates, weights, input, output,  # noqa: N802,N803,A002
            outputGrad, lastCellStateGrad=None, inputGrad=True, bwdIntermediates=False,  # noqa: N803
            debug_name: str = "", options=None, cache=None):
    """LSTM backward pass over the steps in reverse (``popnn::lstm::lstmBwd``).

    ``outputGrad`` has the shape of ``output`` (``[T, B, out]``, or ``[B, out]`` when
    ``params.outputFullSequence`` is false); ``lastCellStateGrad`` (``[B, out]``) may be None.
    ``inputGrad`` / ``bwdIntermediates``: whether to compute the input gradients ``[T, B, in]``
    and keep the gate gradients ``[T, 4, B, out]`` (for :func:`lstmWU`).

    Returns ``(initStateGrad, inputGrad, bwdIntermediates)``: an :class:`LstmState` of the
    gradients of the initial output and cell state, then the requested tensors (None when not
    requested, or when ``params.calcInputGradients`` is false).

    Raises ``poplibs_error`` for invalid params, mismatched tensors, or an activation whose
    derivative is not a function of its output (only SIGMOID, TANH and RELU);
    ``poplar.invalid_option``. The graph is unchanged when it raises.
    """
    name = debug_name or "lstmBwd"
    return _bwd(graph, params, prog, fwdStateInit, fwdIntermediates, weights, input, output, outputGrad,
                lastCellStateGrad, inputGrad, bwdIntermediates, name, options)


def _wu(graph, params, prog, init_state, fwd_inter, bwd_inter, weights, in_, output, name, options):
    from openipu.poplibs import popops
    _check_bwd(params, init_state, fwd_inter, weights, in_, output, name)
    opts = R.parse_options(options, name)
    T, B, I, O = _sizes(params)
    dt = params.dataType
    R.check_tensor(bwd_inter, [T, 4, B, O], dt, name, "bwdIntermediates")
    mmo = R.mm_options(opts)
    outs = output if params.outputFullSequence else fwd_inter.slice(_NUM_FWD_INTER, _NUM_FWD_INTER + 1, 1).squeeze([1])
    h_prev = poplar.concat([init_state.output.expand([0]), outs.slice(0, T - 1, 0)], 0) if T > 1 \
        else init_state.output.expand([0])
    XH = poplar.concat([in_.reshape([T * B, I]), h_prev.reshape([T * B, O])], 1)    # [TB, I+O]
    D = bwd_inter.dimShuffle([0, 2, 1, 3]).reshape([T * B, 4 * O])
    dW = poplin.matMul(graph, XH.transpose(), D, prog, f"{name}/weightGrads", options=mmo)   # [I+O, 4O]
    db = popops.reduce(graph, D, [0], popops.ReduceParams(popops.Operation.ADD), prog, f"{name}/biasGrads")
    wat = opts.get("weightAccumulatorsType")
    if wat is not None and poplar.types.as_type(wat) != dt:
        dW = popops.cast(graph, dW, poplar.types.as_type(wat), prog, f"{name}/castWeightGrads")
        db = popops.cast(graph, db, poplar.types.as_type(wat), prog, f"{name}/castBiasGrads")
    dWin = R.unflatten_units(dW.slice(0, I, 0), 4)
    dWout = R.unflatten_units(dW.slice(I, I + O, 0), 4)
    return LstmWeights(_to_cell_order(params, dWin), _to_cell_order(params, dWout),
                       _to_cell_order(params, db.reshape([4, O])))


def lstmWU(graph, params, prog, fwdStateInit, fwdIntermediates, bwdIntermediates, weights, input,  # noqa: N802,N803,A002
           output, debug_name: str = "", options=None, cache=None):
    """Weight gradients from the forward and backward intermediates (``popnn::lstm::lstmWU``):
    one ``matMul`` ``[in + out, T B] x [T B, 4 out]`` and one bias ``reduce``. Returns an
    :class:`LstmWeights` of gradients (units in ``params.cellOrder``; type
    ``weightAccumulatorsType`` if given). Raises as :func:`lstmBwd`."""
    return _wu(graph, params, prog, fwdStateInit, fwdIntermediates, bwdIntermediates, weights, input, output,
               debug_name or "lstmWU", options)


def lstmBwdWithWU(graph, params, prog, fwdStateInit, fwdIntermediates, weights, input, output,  # noqa: N802,N803,A002
                  outputGrad, lastCellStateGrad=None, inputGrad=True, debug_name: str = "", options=None,  # noqa: N803
                  cache=None):
    """Backward pass and weight update (``popnn::lstm::lstmBwdWithWU``).

    Returns ``(initStateGrad, inputGrad, weightsGrad)``: the :class:`LstmState` of the initial
    state's gradients, ``[T, B, in]`` input gradients (None if ``inputGrad`` is false or
    ``params.calcInputGradients`` is false) and an :class:`LstmWeights` of weight gradients.
    Raises as :func:`lstmBwd`."""
    name = debug_name or "lstmBwdWithWU"
    _check_bwd(params, fwdStateInit, fwdIntermediates, weights, input, output, name)
    R.parse_options(options, name)
    state_grad, in_grad, bwd_inter = _bwd(graph, params, prog, fwdStateInit, fwdIntermediates, weights, input,
                                          output, outputGrad, lastCellStateGrad, inputGrad, True, name, options)
    wg = _wu(graph, params, prog, fwdStateInit, fwdIntermediates, bwd_inter, weights, input, output,
             f"{name}/WU", options)
    return state_grad, in_grad, wg
