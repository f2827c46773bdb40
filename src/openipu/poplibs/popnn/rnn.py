"""Shared pieces of popnn's recurrent layers (PopLibs ``include/popnn/Rnn.hpp``, ``lib/popnn/RnnUtil``).

``popnn.lstm`` and ``popnn.gru`` build their layers as PopLibs does: a *real per-timestep
program*. The sequence is a ``Repeat`` over time steps whose body slices the step's input with
``popops.dynamicSlice``, runs the cell's matrix products with ``poplin.matMul`` and its gates
with popnn non-linearities and popops element-wise maps, and writes the step's output and
intermediates back with ``popops.dynamicUpdate``; the backward pass is a second ``Repeat`` that
walks the steps in reverse. Every cycle therefore comes from the estimators of the ops used
(poplin's planner, ``NonLinearity1D``, ``BinaryOp1D`` / generated map codelets,
``DynamicSlice2D`` / ``DynamicUpdateSlice2D``), plus the loop counter's increment
(:data:`openipu.poplibs.popops.loop.INCREMENT_CYCLES`) and exchange, and grows linearly with the
number of steps. Weight updates are done after the backward loop, over the whole sequence, as one
``matMul`` per weight matrix and one ``reduce`` for the biases (PopLibs' ``lstmWU``/``gruWU``
structure).

Sequence tensors (inputs, outputs, intermediates, gradients) are ``[T, ...]`` tensors made with
``popops.createSliceableTensor`` over dimension 0, so each step's slice needs no exchange.

Not PopLibs API except :class:`RnnParams`; the helpers are used by ``lstm`` and ``gru``.
"""

from __future__ import annotations

import functools

import numpy as np

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popnn._common import poplibs_error
from openipu.poplibs.popnn.non_linearity import NonLinearityType, _as_type
from openipu.poplibs.popops.loop import INCREMENT_CYCLES

__all__ = ["RnnParams"]


class RnnParams:
    """``popnn::rnn::RnnParams``: data type, batch size, time steps and ``layerSizes`` =
    ``[inputSize, outputSize]``. (Variable per-batch time steps are not supported.)"""

    def __init__(self, dataType, batchSize, timeSteps, layerSizes):  # noqa: N803
        self.dataType = poplar.types.as_type(dataType) if isinstance(dataType, str) else dataType
        self.batchSize = batchSize
        self.timeSteps = timeSteps
        self.maxTimeSteps = timeSteps
        self.layerSizes = list(layerSizes) if isinstance(layerSizes, (list, tuple)) else layerSizes

    def __repr__(self):
        return (f"RnnParams({self.dataType}, batchSize={self.batchSize}, timeSteps={self.timeSteps}, "
                f"layerSizes={self.layerSizes})")


class CellParams:
    """The fields ``lstm.LstmParams`` and ``gru.GruParams`` share (PopLibs' ``LstmParams`` /
    ``GruParams``): ``rnn`` (:class:`RnnParams`), ``dataType``, ``batchSize``, ``timeSteps``,
    ``layerSizes``, ``outputFullSequence`` (True), ``calcInputGradients`` (True), ``cellOrder``,
    ``activation``, ``recurrentActivation``. Not PopLibs API: the layers' params derive from it."""

    def __init__(self, dataType, batchSize, timeSteps, layerSizes, activation, recurrentActivation,  # noqa: N803
                 cellOrder):  # noqa: N803
        self.rnn = RnnParams(dataType, batchSize, timeSteps, layerSizes)
        self.dataType, self.batchSize = self.rnn.dataType, batchSize
        self.timeSteps, self.layerSizes = timeSteps, self.rnn.layerSizes
        self.outputFullSequence = True
        self.calcInputGradients = True
        self.cellOrder = cellOrder
        self.activation = activation
        self.recurrentActivation = recurrentActivation


# -- validation ---------------------------------------------------------------------------------
def validate(params, kind: str, units, what: str) -> None:
    """Raise ``poplibs_error`` unless ``params`` describe a valid single-layer ``kind`` RNN."""
    dt = params.dataType
    if dt not in (poplar.FLOAT, poplar.HALF):
        raise poplibs_error(f"{what}: {kind} dataType must be FLOAT or HALF, got {dt}")
    sizes = params.layerSizes
    if not isinstance(sizes, (list, tuple)) or len(sizes) != 2:
        raise poplibs_error(f"{what}: Invalid {kind} params: layerSizes must be [inputSize, outputSize] "
                            f"(2 sizes), got {sizes!r}")
    for nm, v in (("batchSize", params.batchSize), ("timeSteps", params.timeSteps),
                  ("inputSize", sizes[0]), ("outputSize", sizes[1])):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise poplibs_error(f"{what}: {kind} {nm} must be a positive integer, got {v!r}")
    try:
        order = sorted(int(u) for u in params.cellOrder)
    except (TypeError, ValueError):
        order = None
    if order != list(range(len(units))):
        raise poplibs_error(f"{what}: {kind} cellOrder must be a permutation of {[u.name for u in units]}, "
                            f"got {params.cellOrder!r}")
    for nm in ("activation", "recurrentActivation"):
        nl = _as_type(getattr(params, nm))
        if nl in (NonLinearityType.SOFTMAX, NonLinearityType.SOFTMAX_STABLE, NonLinearityType.SOFTMAX_SCALED):
            raise poplibs_error(f"{what}: {kind} {nm} cannot be a softmax ({nl.name})")


#: Non-linearities whose derivative is a function of their output (what the intermediates keep).
BWD_NLS = (NonLinearityType.SIGMOID, NonLinearityType.TANH, NonLinearityType.RELU)


def validate_bwd(params, kind, what):
    for nm in ("activation", "recurrentActivation"):
        nl = _as_type(getattr(params, nm))
        if nl not in BWD_NLS:
            raise poplibs_error(f"{what}: the {kind} backward pass supports {nm} SIGMOID, TANH or RELU (their "
                                f"derivatives come from the saved outputs), got {nl.name}")


def check_tensor(t, shape, type_, what, name):
    if not isinstance(t, poplar.Tensor):
        raise poplibs_error(f"{what}: {name} must be a poplar Tensor, got {type(t).__name__}")
    if list(t.shape()) != list(shape):
        raise poplibs_error(f"{what}: {name} must have shape {list(shape)} for these params, got {t.shape()}")
    if t.elementType() != type_:
        raise poplibs_error(f"{what}: {name} must be {type_} (params.dataType), got {t.elementType()}")


_OPTIONS = {"availableMemoryProportion", "inferenceOnly", "partialsType", "weightAccumulatorsType",
            "preCalcWeights", "recomputationMode", "rnnCodeReuse"}


def parse_options(options, what: str) -> dict:
    """The RNN options (``createInput`` in Lstm.hpp / Gru.hpp): unknown keys or bad values raise
    ``poplar.invalid_option``."""
    opts = dict(options or {})
    for k in opts:
        if k not in _OPTIONS:
            raise poplar.invalid_option(f"{what}: unknown option '{k}'; known: {', '.join(sorted(_OPTIONS))}")
    out = {}
    if "availableMemoryProportion" in opts:
        try:
            amp = float(opts["availableMemoryProportion"])
        except ValueError:
            amp = -1.0
        if not 0.0 <= amp <= 1.0:
            raise poplar.invalid_option(f"{what}: availableMemoryProportion must be in [0, 1], "
                                        f"got {opts['availableMemoryProportion']!r}")
        out["availableMemoryProportion"] = amp
    for k in ("partialsType", "weightAccumulatorsType"):
        if k in opts:
            v = str(opts[k]).lower()
            if v not in ("half", "float"):
                raise poplar.invalid_option(f"{what}: {k} must be 'half' or 'float', got {opts[k]!r}")
            out[k] = v
    for k in ("inferenceOnly", "preCalcWeights", "rnnCodeReuse"):
        if k in opts:
            v = str(opts[k]).lower()
            if v not in ("true", "false", "1", "0"):
                raise poplar.invalid_option(f"{what}: {k} must be true or false, got {opts[k]!r}")
            out[k] = v in ("true", "1")
    if "recomputationMode" in opts:
        v = str(opts["recomputationMode"])
        if v not in ("none", "cellAndTanh", "full"):
            raise poplar.invalid_option(f"{what}: recomputationMode must be none, cellAndTanh or full, got {v!r}")
        out["recomputationMode"] = v
    return out


def mm_options(opts: dict) -> dict:
    """The ``poplin.matMul`` options an RNN passes on."""
    mm = {}
    if "availableMemoryProportion" in opts:
        mm["availableMemoryProportion"] = opts["availableMemoryProportion"]
    if "partialsType" in opts:
        mm["partialsType"] = opts["partialsType"]
    return mm


def sizes(params):
    """``(timeSteps, batchSize, inputSize, outputSize)`` of LSTM/GRU ``params``, as ints."""
    return int(params.timeSteps), int(params.batchSize), int(params.layerSizes[0]), int(params.layerSizes[1])


def canonical(params, t):
    """``t`` (outer dimension = units in ``params.cellOrder``) viewed with its units in canonical
    order 0, 1, ... (a view)."""
    order = [int(u) for u in params.cellOrder]
    return units_view(t, [order.index(u) for u in range(len(order))])


def to_cell_order(params, t):
    """``t`` (units in canonical order) viewed with its units in ``params.cellOrder``."""
    return units_view(t, [int(u) for u in params.cellOrder])


# -- tensors ----------------------------------------------------------------------------------
def seq_tensor(graph, type_, shape, name):
    """A ``[T, ...]`` sequence tensor whose step slices sit on one tile per column."""
    from openipu.poplibs.popops.dynamic_slice import createSliceableTensor
    return createSliceableTensor(graph, type_, list(shape), [0], [1], 0, None, name)


def linear_var(graph, type_, shape, name):
    from openipu.poplibs.poputil import mapTensorLinearly
    t = graph.addVariable(type_, list(shape), name)
    mapTensorLinearly(graph, t)
    return t


def create_input(graph, params, options, what: str, name: str):
    """The ``[T, B, inputSize]`` input sequence of ``params`` (``createInput``); options checked."""
    parse_options(options, what)
    T, B, I, O = sizes(params)
    return seq_tensor(graph, params.dataType, [T, B, I], name)


def create_state(graph, params, name: str):
    """A ``[B, outputSize]`` state tensor of ``params.dataType``, mapped linearly."""
    T, B, I, O = sizes(params)
    return linear_var(graph, params.dataType, [B, O], name)


def create_weights_kernel(graph, params, units: int, options, what: str):
    """``(inputWeights [units, in, out], outputWeights [units, out, out])``, mapped linearly [A]
    (``createWeightsKernel``); options checked."""
    parse_options(options, what)
    T, B, I, O = sizes(params)
    return (linear_var(graph, params.dataType, [units, I, O], what + "/inputWeights"),
            linear_var(graph, params.dataType, [units, O, O], what + "/outputWeights"))


def output_grad_seq(graph, params, out_grad, prog, name):
    """The gradient of the layer's output as a ``[T, B, out]`` sequence: ``out_grad`` itself with
    ``outputFullSequence``, else zeros with ``out_grad`` (``[B, out]``) at the last step."""
    if params.outputFullSequence:
        return out_grad
    from openipu.poplibs import popops
    T, B, I, O = sizes(params)
    gseq = seq_tensor(graph, params.dataType, [T, B, O], f"{name}/outputGradSeq")
    popops.zero(graph, gseq, prog, f"{name}/zeroOutputGradSeq")
    prog.add(P.Copy(out_grad, gseq[T - 1]))
    return gseq


def prev_outputs(init, outs, steps: int):
    """``[T, B, out]`` view: the layer's output before each step (``init``, then ``outs[:-1]``)."""
    if steps == 1:
        return init.expand([0])
    return poplar.concat([init.expand([0]), outs.slice(0, steps - 1, 0)], 0)


def save_step(graph, seq, value, idx, prog, name):
    """``seq[idx] = value`` (``popops.dynamicUpdate`` over dimension 0); nothing when ``seq`` is None."""
    if seq is not None:
        from openipu.poplibs import popops
        popops.dynamicUpdate(graph, seq, value.expand([0]), idx, [0], [1], prog, name)


def bias_grads(graph, deltas, prog, name):
    """The bias gradients: ``deltas`` ``[T B, n]`` summed over the sequence with ``popops.reduce``."""
    from openipu.poplibs import popops
    return popops.reduce(graph, deltas, [0], popops.ReduceParams(popops.Operation.ADD), prog, name)


def cast_weight_grads(graph, opts: dict, type_, grads: dict, prog, name):
    """``grads`` (name -> tensor) cast to the ``weightAccumulatorsType`` option when it is given
    and differs from ``type_`` (one ``popops.cast`` each, named ``{name}/cast{Name}``)."""
    wat = opts.get("weightAccumulatorsType")
    if wat is None or poplar.types.as_type(wat) == type_:
        return grads
    from openipu.poplibs import popops
    wt = poplar.types.as_type(wat)
    return {k: popops.cast(graph, t, wt, prog, f"{name}/cast{k}") for k, t in grads.items()}


def stack(ts):
    """``[U, ...]`` view of equally shaped tensors (never copies)."""
    return poplar.concat([t.expand([0]) for t in ts], 0)


def units_view(t, order):
    """View ``t`` (outer dimension = units) with its units permuted to ``order`` (unit indices)."""
    return stack([t[int(u)] for u in order])


def flatten_units(w):
    """``[U, a, n]`` -> ``[a, U * n]`` view (column ``u * n + j`` is unit ``u``, output ``j``)."""
    U, a, n = w.shape()
    return w.dimShuffle([1, 0, 2]).reshape([a, U * n])


def unflatten_units(t, U):
    """``[a, U * n]`` -> ``[U, a, n]`` view."""
    a, un = t.shape()
    return t.reshape([a, U, un // U]).dimShuffle([1, 0, 2])


def gates_view(mm, U):
    """A ``[B, U * n]`` matmul result viewed as ``[U, B, n]``."""
    return unflatten_units(mm, U)


# -- the time loop ------------------------------------------------------------------------------
@kernel
def _step_kernel(var, step, ctx):
    ctx.write(var, ctx.read(var) + step)


def time_loop(graph, steps: int, body, reverse: bool, name: str):
    """``Sequence``: an UNSIGNED_INT step index on tile 0 set to 0 (or ``steps - 1`` when
    ``reverse``), then ``Repeat(steps, body(index) + index += 1 (or -= 1))``. ``body`` is called
    once with the index tensor and returns a Program. The counter update is costed like
    ``popops.countedLoop``'s increment."""
    index = graph.addVariable(poplar.UNSIGNED_INT, [1], f"{name}/step")
    graph.setTileMapping(index, 0)
    start = steps - 1 if reverse else 0
    c = graph.addConstant(poplar.UNSIGNED_INT, [1], start, f"{name}/start{start}")
    graph.setTileMapping(c, 0)
    seq = P.Sequence()
    seq.add(P.Copy(c, index))
    body_prog = body(index)
    cs = graph.addComputeSet(f"{name}/{'decrement' if reverse else 'increment'}")
    tile0 = graph._tiles[:1].astype(np.int64)
    graph.add_vertex_group(cs, VertexGroup(
        "popops::ScaledAddSupervisor<unsigned int>", tile0, np.array([INCREMENT_CYCLES]),
        functools.partial(_step_kernel, index, -1 if reverse else 1), reads=[Access(index)],
        writes=[Access(index)], multi=True, flops=0.0, state_bytes=16))
    seq.add(P.Repeat(steps, P.Sequence(body_prog, P.Execute(cs)), debugContext=name))
    return seq
