"""``builder.aiGraphcore``: PopART's ``ai.graphcore`` builder ops (:class:`AiGraphcoreOpset1`), with
the argument checks PopART's ``AiGraphcoreOpset1`` makes (input counts, reduction / data type
enums, collective operators) and the ops' ``setup()`` checks run on the inferred shapes
(:mod:`openipu.popart.graphcore_ops`), raising ``popart_exception`` with PopART's wording.
"""

from __future__ import annotations

import numpy as np

from openipu.popart.builder_aionnx import _to_attr_value
from openipu.popart.debug_prefix import accept_debug_prefix
from openipu.popart.errors import popart_exception
from openipu.popart import graphcore_ops as gco
from openipu.popart.graphcore_ops import GRAPHCORE, find_kernel
from openipu.popart.log import log
from openipu.popart.shapes import probe
from openipu.popart.tensorinfo import dtype_name


_REDUCTION = {"Sum": 0, "Mean": 1, "NoReduction": 2}


@accept_debug_prefix
class AiGraphcoreOpset1:
    """``builder.aiGraphcore``: PopART's ``ai.graphcore`` ops (``AiGraphcoreOpset1``).

    Each method adds one node and returns its output id (a list for ops with several outputs),
    as PopART's builder does. ``args`` is a list of tensor ids; a wrong count raises PopART's
    ``"<Op> has invalid number of inputs <n>. Must be between <lo>..<hi>"`` (``popart_exception``).
    Reduction enums (``popart.ReductionType``, ``popart.ScatterReduction``, ``popart.InitType``)
    may be given as the enum member or its name.
    """

    _version = 1

    def __init__(self, builder: "Builder"):
        self._builder = builder

    def _op(self, op, args, attrs, debugContext="", n=1, out_infos=None):  # noqa: N803
        args = _tensor_ids(op, args)
        lo, hi = _GC_ARITY.get(op, (None, None))
        if lo is not None and not lo <= len(args) <= hi:
            raise popart_exception(f"{op} has invalid number of inputs {len(args)}. Must be between {lo}..{hi}")
        at = {k: _to_attr_value(k, v) for k, v in attrs.items()}
        return self._builder._op(op, GRAPHCORE, 1, args, n, at, debugContext, out_infos=out_infos)

    def getOpsetVersion(self) -> int:  # noqa: N802
        return 1

    # -- element-wise and identity-like ---------------------------------------------------------
    def gelu(self, args, debugContext=""):  # noqa: N803
        """GELU, tanh approximation (``popnn`` GELU); float, shape kept."""
        return self._op("Gelu", args, {}, debugContext)[0]

    def geluerf(self, args, debugContext=""):  # noqa: N803
        """GELU with the exact erf; float, shape kept."""
        return self._op("GeluErf", args, {}, debugContext)[0]

    def swish(self, args, debugContext=""):  # noqa: N803
        """``x * sigmoid(x)`` (SiLU); float, shape kept."""
        return self._op("Swish", args, {}, debugContext)[0]

    def scale(self, args, scale, debugContext=""):  # noqa: N803
        """``x * scale`` (scale a float)."""
        return self._op("Scale", args, {"scale": float(scale)}, debugContext)[0]

    def scaledadd(self, args, scale0=1.0, scale1=1.0, debugContext=""):  # noqa: N803
        """``scale0 * a + scale1 * b``; ``args = [a, b]`` or ``[a, b, scale0, scale1]`` (scalar
        tensors that replace the attributes)."""
        return self._op("ScaledAdd", args, {"scale0": float(scale0), "scale1": float(scale1)}, debugContext)[0]

    def detach(self, args, debugContext=""):  # noqa: N803
        """The input unchanged; no gradient flows back through it in training."""
        return self._op("Detach", args, {}, debugContext)[0]

    def nop(self, args, debugContext=""):  # noqa: N803
        """The input unchanged (an identity the optimisations keep)."""
        return self._op("Nop", args, {}, debugContext)[0]

    def printtensor(self, args, print_gradient=1, debugContext="", title="", summariseThreshold=1000,  # noqa: N803
                    edgeItems=3, maxLineWidth=75, digits=8, floatFormat=0, separator=" ", openBracket="[",
                    closeBracket="]"):
        """The input unchanged; each run prints it to stdout as ``title: [values]`` (``title``
        defaults to the input id), and in training its gradient too (as ``<title>_gradient``, or
        the gradient's id) unless ``print_gradient`` is 0. The formatting arguments are
        accepted; the text is Poplar's ``PrintTensor`` format."""
        return self._op("PrintTensor", args, {"print_gradient": int(print_gradient), "title": title or None},
                        debugContext)[0]

    def tensorremap(self, args, remap_type=0, debugContext=""):  # noqa: N803
        """The input unchanged, with a layout chosen for its consumers (``popart.TensorRemapType``
        FwdBwdReverse 0, FwdBwd 1, Fwd 2, or the number): functionally an identity."""
        kinds = ("FwdBwdReverse", "FwdBwd", "Fwd")
        if not isinstance(remap_type, (int, np.integer)):
            name = str(remap_type).split(".")[-1]
            if name not in kinds:
                raise popart_exception(f"Unknown TensorRemapType '{remap_type}': use one of {', '.join(kinds)}")
            remap_type = kinds.index(name)
        return self._op("TensorRemap", args, {"remap_type": int(remap_type)}, debugContext)[0]

    def replicatedallreduce(self, args, collectiveOperator=None, commGroup=None, debugContext=""):  # noqa: N803
        """Sum (``collectiveOperator``, default Add) of the input over the replicas; with one
        replica the input itself. ``commGroup`` (:class:`popart.CommGroup`): reduce within each
        group of replicas only (``Consecutive`` / ``Orthogonal`` groups of ``replicaGroupSize``;
        ``Ungrouped``: each replica its own value), kept as the op's ``commGroup`` attribute
        ``[type, size]``; a size that does not divide the replication factor raises
        ``popart_exception`` when the session is made. PopART's deprecated form
        ``replicatedallreduce(args, [type, size])`` (a list in the operator's place) is taken as
        the ``commGroup``, with PopART's deprecation warning."""
        if isinstance(collectiveOperator, (list, tuple)):      # the deprecated (args, commGroup) form
            log("builder").warning("[AiGraphcoreOpset1::replicatedallreduce] Deprecated builder function.")
            collectiveOperator, commGroup = None, _comm_group_of_list(collectiveOperator)
        op, debugContext = _collective(collectiveOperator, debugContext, "replicatedallreduce")
        attrs = {"op": op, **_comm_group_attr(commGroup, "replicatedallreduce")}
        return self._op("ReplicatedAllReduce", args, attrs, debugContext)[0]

    def incrementmod(self, args, increment, modulus, debugContext=""):  # noqa: N803
        """``(x + increment) % modulus`` (a float ``increment`` and ``modulus``; the type is x's)."""
        if float(modulus) == 0:
            raise popart_exception("IncrementModOp: modulus must not be 0")
        return self._op("IncrementMod", args, {"increment": float(increment), "modulus": float(modulus)},
                        debugContext)[0]

    def copyvarupdate(self, args, debugContext=""):  # noqa: N803
        """``args = [variable, updater]``: each run, the variable (an initializer) takes the
        updater's value; returns the updated variable (use it to order later reads)."""
        return self._op("CopyVarUpdate", args, {}, debugContext)[0]

    def abort(self, args=(), debugContext=""):  # noqa: N803
        """Stop the program (``poplar_application_runtime_error`` from ``run``): always with no
        input, else when the scalar input is non-zero. Returns None."""
        self._op("Abort", list(args), {}, debugContext, n=0, out_infos=[])
        return None

    # -- losses --------------------------------------------------------------------------------
    def identityloss(self, args, reduction="Mean", debugContext=""):  # noqa: N803
        """The input as a loss: summed (Sum), averaged (Mean), or as it is (NoReduction)."""
        return self._op("IdentityLoss", args, {"reduction": _reduction(reduction)}, debugContext)[0]

    def nllloss(self, args, reduction="Mean", ignoreIndex=None, inputIsLogProbability=False,  # noqa: N803
                debugContext=""):  # noqa: N803
        """Negative log-likelihood of ``args = [probs, label]`` (probs ``[..., C]`` float, label
        ``[...]`` int); a scalar unless ``reduction`` is ``NoReduction``."""
        attrs = {"reduction": _reduction(reduction), "inputIsLogProbability": int(bool(inputIsLogProbability))}
        if ignoreIndex is not None:
            attrs["ignoreIndex"] = int(ignoreIndex)
        return self._op("Nll", args, attrs, debugContext)[0]

    def l1loss(self, args, lambda_, reduction="Mean", debugContext=""):  # noqa: N803
        """``lambda_ * |x|`` reduced (``args = [x]``)."""
        return self._op("L1", args, {"lambda": float(lambda_), "reduction": _reduction(reduction)}, debugContext)[0]

    def ctcloss(self, args, reduction="Mean", blank=0, outDataType="UNDEFINED", zeroInfinity=False,  # noqa: N803
                debugContext=""):
        """Connectionist temporal classification loss (``torch.nn.functional.ctc_loss``) of
        ``args = [log_probs [T, N, C] float, targets [N, S] int, input_lengths [N] int,
        target_lengths [N] int]``; Mean divides each sample's loss by its target length, then
        averages over the batch. ``outDataType`` ("UNDEFINED": the log_probs' type) is the
        loss's type; ``zeroInfinity`` zeroes infinite losses and their gradients. Returns the
        loss id (PopART's Ctc op has a second output, the gradient of the losses w.r.t. the
        log-probabilities, which ``_ctcloss`` also returns)."""
        return self._ctcloss(args, reduction, blank, outDataType, zeroInfinity, debugContext)[0]

    def _ctcloss(self, args, reduction="Mean", blank=0, outDataType="UNDEFINED", zeroInfinity=False,  # noqa: N803
                 debugContext=""):
        out = str(outDataType).split(".")[-1].upper()
        if out not in ("UNDEFINED", "FLOAT", "FLOAT16"):
            raise popart_exception(f"CtcOp: outDataType must be UNDEFINED, FLOAT or FLOAT16, not {outDataType}")
        attrs = {"reduction": _reduction(reduction), "blank": int(blank), "outDataType": out,
                 "zeroInfinity": int(bool(zeroInfinity))}
        return self._op("Ctc", args, attrs, debugContext, n=2)

    # -- shapes, slices and views --------------------------------------------------------------
    def reshape(self, args, shape, debugContext=""):  # noqa: N803
        """Reshape to ``shape`` (an attribute, not a tensor input)."""
        if isinstance(args, str):
            args = [args]
        return self._op("Reshape", args, {"shape": [int(s) for s in shape]}, debugContext)[0]

    def subsample(self, args, strides, debugContext=""):  # noqa: N803
        """Every ``strides[d]``-th element along each dimension ``d``."""
        if any(int(s) < 1 for s in strides):
            raise popart_exception(f"Strides invalid. Must be greater than 0, got {list(strides)}")
        return self._op("Subsample", args, {"strides": [int(s) for s in strides]}, debugContext)[0]

    def reverse(self, args, dimensions, debugContext=""):  # noqa: N803
        """The input flipped along ``dimensions``."""
        return self._op("Reverse", args, {"dimensions": [int(d) for d in dimensions]}, debugContext)[0]

    def slice(self, args, ends, starts, axes=(), debugContext=""):  # noqa: N803
        """ONNX Slice with ``starts`` / ``ends`` / ``axes`` as attributes."""
        return self._op("Slice", args, {"ends": list(ends), "starts": list(starts), "axes": list(axes)},
                        debugContext)[0]

    def depthtospace(self, args, blocksize, mode="DCR", debugContext=""):  # noqa: N803
        """``[N, C, H, W] -> [N, C / B^2, H B, W B]`` (ONNX DepthToSpace-11, ``mode`` DCR or CRD)."""
        if str(mode) not in ("DCR", "CRD"):
            raise popart_exception(f"DepthToSpace: mode must be 'DCR' or 'CRD', not '{mode}'")
        if int(blocksize) < 1:
            raise popart_exception(f"DepthToSpace: blocksize must be positive, got {blocksize}")
        return self._op("DepthToSpace", args, {"blocksize": int(blocksize), "mode": str(mode)}, debugContext)[0]

    def dynamicslice(self, args, axes, sizes, noOverlap=0, debugContext=""):  # noqa: N803
        """``tensor[offset]``: ``args = [tensor, offset]``, ``offset`` ``[len(axes)]`` (integers,
        element offsets along ``axes``); the output has ``sizes[i]`` elements along ``axes[i]``."""
        return self._op("DynamicSlice", args, _dyn_attrs(axes, sizes, noOverlap), debugContext)[0]

    def dynamicupdate(self, args, axes, sizes, noOverlap=0, debugContext=""):  # noqa: N803
        """A copy of ``tensor`` with ``slice`` written at ``offset``: ``args = [tensor, offset, slice]``."""
        return self._op("DynamicUpdate", args, _dyn_attrs(axes, sizes, noOverlap), debugContext)[0]

    def dynamiczero(self, args, axes, sizes, debugContext=""):  # noqa: N803
        """A copy of ``tensor`` with the slice at ``offset`` zeroed: ``args = [tensor, offset]``."""
        return self._op("DynamicZero", args, _dyn_attrs(axes, sizes), debugContext)[0]

    def dynamicadd(self, args, axes, sizes, debugContext=""):  # noqa: N803
        """A copy of ``tensor`` with ``slice`` added at ``offset``: ``args = [tensor, offset, slice]``."""
        return self._op("DynamicAdd", args, _dyn_attrs(axes, sizes), debugContext)[0]

    def sequenceslice(self, args, zeroUnused=0, debugContext=""):  # noqa: N803
        """``args = [source, destination, N, sourceOffset, destinationOffset]``: a copy of
        ``destination`` with rows ``destinationOffset[i] : +N[i]`` taken from rows
        ``sourceOffset[i] : +N[i]`` of ``source`` (outer dimension; rank >= 2); unreferenced
        rows zeroed when ``zeroUnused``."""
        return self._op("SequenceSlice", args, {"zeroUnused": int(zeroUnused)}, debugContext)[0]

    def init(self, shape, data_type, init_type, batch_axis=-1, debugContext=""):  # noqa: N803
        """A new tensor of ``shape`` and ``data_type`` (``popart.DataType`` / name / PopART's enum
        value), zeroed (``InitType.Zero``) or left as it is (``NoInit``; zeros in openipu's
        fresh memory). ``batch_axis`` is recorded."""
        if isinstance(batch_axis, str) and not debugContext:
            batch_axis, debugContext = -1, batch_axis
        attrs = {"shape": [int(s) for s in shape], "data_type": _data_type_code(data_type),
                 "init_type": _init_type(init_type), "batch_axis": int(batch_axis)}
        name = _DATA_TYPES[attrs["data_type"]]
        return self._op("Init", [], attrs, debugContext, out_infos=[(name, attrs["shape"])])[0]

    # -- normalisation, reductions, sorting, indexing --------------------------------------------
    def groupnormalization(self, args, num_groups, epsilon=1e-5, debugContext=""):  # noqa: N803
        """Group normalisation of ``args = [x [N, C, ...], scale [C], bias [C]]`` over
        ``num_groups`` groups of channels (contiguous; strided with the session option
        ``groupNormStridedChannelGrouping``). Returns ``[y, mean, invStdDev]``, the statistics
        ``[N * num_groups]``."""
        if int(num_groups) < 1:
            raise popart_exception(f"GroupNormOp: num_groups must be positive, got {num_groups}")
        return self._op("GroupNormalization", args, {"num_groups": int(num_groups), "epsilon": float(epsilon)},
                        debugContext, n=3)

    def reducemedian(self, args, axes=None, keepdims=1, debugContext=""):  # noqa: N803
        """Median over ``axes`` (all by default; the lower median of an even count) and its index
        (flattened over the reduced axes, INT32). Returns ``[values, indices]``."""
        attrs = {"keepdims": int(keepdims)}
        if axes is not None:
            attrs["axes"] = [int(a) for a in axes]
        return self._op("ReduceMedian", args, attrs, debugContext, n=2)

    def scatterreduce(self, args, axis_size, axis=-1, reduction="Sum", enable_index_broadcast=1,  # noqa: N803
                      debugContext=""):
        """``out[i] = reduce(src[index == i])`` along ``axis`` (``axis_size`` rows out):
        ``args = [src, index]`` or ``[src, index, initial]``; ``reduction`` Sum, Max, Min, Mul
        or NoReduction (a plain scatter); rows no index selects are 0 (or ``initial``). A 1-D
        ``index`` broadcasts along ``axis`` when ``enable_index_broadcast``."""
        if isinstance(enable_index_broadcast, str) and not debugContext:
            enable_index_broadcast, debugContext = 1, enable_index_broadcast
        red = str(reduction).split(".")[-1]
        if red.lower() not in _SCATTER_REDUCTIONS:
            raise popart_exception(f"Unknown ScatterReduction '{reduction}'. Use one of Sum, Max, Min, Mul, "
                                   "NoReduction")
        return self._op("ScatterReduce", args, {"axis_size": int(axis_size), "axis": int(axis),
                                                "reduction": _SCATTER_REDUCTIONS[red.lower()],
                                                "enable_index_broadcast": int(enable_index_broadcast)},
                        debugContext)[0]

    def groupedgather(self, args, axis=0, group_size=1, debugContext=""):  # noqa: N803
        """Gather per group: ``args = [data [G, ...], indices [G, ...]]``, group ``g``'s
        indices index group ``g``'s data along ``axis`` (of the data, >= 1)."""
        return self._op("GroupedGather", args, {"axis": int(axis), "group_size": int(group_size)}, debugContext)[0]

    def sort(self, args, axis=-1, descending=False, stable=False, debugContext=""):  # noqa: N803
        """Sort along ``axis``: returns ``[values, indices]`` (indices INT64, as PopART's Sort)."""
        return self._op("Sort", args, {"axis": int(axis), "descending": int(bool(descending)),
                                       "stable": int(bool(stable))}, debugContext, n=2)

    def bucketize(self, args, right=False, debugContext=""):  # noqa: N803
        """``torch.bucketize``: for ``args = [x, boundaries]`` (boundaries 1-D, sorted), the
        index of each element's bucket (INT32)."""
        return self._op("Bucketize", args, {"right": int(bool(right))}, debugContext)[0]

    def normalize_image(self, args, scale=1.0, debugContext=""):  # noqa: N803
        """``args = [image [..., 3], offsets [3], scales [3]]``: ``(image * scale - offsets[c]) *
        scales[c]`` per channel, padded to 4 channels with zeros (``popops::normaliseImage``);
        UINT8 images give FLOAT16."""
        return self._op("NormalizeImage", args, {"scale": float(scale)}, debugContext)[0]

    # -- dropout -------------------------------------------------------------------------------
    def shapeddropout(self, args, shape, ratio=0.5, debugContext=""):  # noqa: N803
        """Dropout whose mask has ``shape`` (broadcast over the input) in training: zero with
        probability ``ratio``, else scale by ``1 / (1 - ratio)``; the identity at inference."""
        if not 0 <= float(ratio) < 1:
            raise popart_exception(f"{ratio} ratio value {ratio} is not valid. Please use a value in the interval "
                                   "[0,1)")
        return self._op("ShapedDropout", args, {"shape": [int(s) for s in shape], "ratio": float(ratio)},
                        debugContext)[0]

    # -- subgraphs, convolutions ---------------------------------------------------------------
    def call(self, args, num_outputs, callee, debugContext=""):  # noqa: N803
        """Call subgraph ``callee`` (a builder from ``createSubgraphBuilder``) on ``args`` (its
        inputs, in order); returns its ``num_outputs`` outputs (a list). The session inlines the
        call, so training differentiates through it."""
        from openipu.popart.builder import Builder

        if not isinstance(callee, Builder) or callee._parent is None:
            raise popart_exception("call: callee must be a subgraph builder (builder.createSubgraphBuilder())")
        g = callee._model.graph
        args = _tensor_ids("Call", args)
        if len(args) != len(g.input):
            raise popart_exception(f"call: the callee has {len(g.input)} inputs but {len(args)} arguments were given")
        if int(num_outputs) != len(g.output):
            raise popart_exception(f"call: the callee has {len(g.output)} outputs but num_outputs is {num_outputs}")
        outs = [callee._infos.get(o.name) for o in g.output]
        return self._op("Call", args, {"callee": callee}, debugContext, n=int(num_outputs),
                        out_infos=outs if all(o is not None for o in outs) else None)

    def multiconv(self, args, dilations=(), inDilations=(), pads=(), outPads=(), strides=(),  # noqa: N803
                  availableMemoryProportions=(), partialsTypes=(), planType=None, perConvReservedTiles=None,
                  cycleBackOff=None, enableConvDithering=(), debugContext=""):
        """Several convolutions as one op: ``args = [[X0, W0(, B0)], [X1, W1(, B1)], ...]``,
        each as ``aiOnnx.conv`` (groups from the shapes). The per-convolution lists (dilations,
        pads, strides, availableMemoryProportions, partialsTypes) are empty or one entry per
        convolution. Returns one output id per convolution."""
        convs = [list(c) for c in args]
        n = len(convs)
        if n == 0:
            raise popart_exception("MultiConvOp: at least one convolution is needed")
        for name, v in (("dilations", dilations), ("inDilations", inDilations), ("pads", pads), ("outPads", outPads),
                        ("strides", strides), ("availableMemoryProportions", availableMemoryProportions),
                        ("partialsTypes", partialsTypes), ("enableConvDithering", enableConvDithering)):
            if len(v) not in (0, n):
                raise popart_exception(f"MultiConvOp: {name} must be empty or have one entry per convolution ({n}), "
                                       f"got {len(v)}")
        if any(any(int(d) != 1 for d in v) for v in inDilations) or any(any(int(p) for p in v) for v in outPads):
            raise popart_exception("openipu's multiconv supports no inDilations / outPads (ONNX Conv has none)")
        flat = []
        for c in convs:
            if len(c) not in (2, 3):
                raise popart_exception(f"MultiConvOp: each convolution takes [data, weights] or [data, weights, bias], "
                                       f"got {len(c)} tensors")
            flat += c + [""] * (3 - len(c))
        attrs = {"num_convs": n}
        for name, v in (("strides", strides), ("pads", pads), ("dilations", dilations)):
            if len(v):
                attrs[name] = [int(x) for e in v for x in e]
                attrs[f"{name}_lens"] = [len(e) for e in v]
        if len(availableMemoryProportions):
            attrs["availableMemoryProportions"] = [float(x) for x in availableMemoryProportions]
        if len(partialsTypes):
            attrs["partialsTypes"] = [str(x) for x in partialsTypes]
        return self._op("MultiConv", flat, attrs, debugContext, n=n)

    # -- other element-wise ops ----------------------------------------------------------------
    def round(self, args, debugContext=""):  # noqa: N803
        """Round half to even (ONNX Round-11), shape and type kept."""
        return self._op("Round", args, {}, debugContext)[0]

    def nearbyint(self, args, debugContext=""):  # noqa: N803
        """Round to the nearest integer, ties to even (as ``round``)."""
        return self._op("Nearbyint", args, {}, debugContext)[0]

    def fmod(self, args, debugContext=""):  # noqa: N803
        """``fmod(a, b)``: remainder with the dividend's sign (C ``fmod``), broadcasting."""
        return self._op("Fmod", args, {}, debugContext)[0]

    def remainder(self, args, debugContext=""):  # noqa: N803
        """``a % b`` with the divisor's sign (Python's ``%``), broadcasting."""
        return self._op("Remainder", args, {}, debugContext)[0]

    def atan2(self, args, debugContext=""):  # noqa: N803
        """``atan2(y, x)`` of ``args = [y, x]`` (radians in (-pi, pi]), broadcasting."""
        return self._op("Atan2", args, {}, debugContext)[0]

    def expm1(self, args, debugContext=""):  # noqa: N803
        """``exp(x) - 1``, shape kept."""
        return self._op("Expm1", args, {}, debugContext)[0]

    def log1p(self, args, debugContext=""):  # noqa: N803
        """``log(x + 1)``, shape kept."""
        return self._op("Log1p", args, {}, debugContext)[0]

    def bitwisenot(self, args, debugContext=""):  # noqa: N803
        """``~x`` of an integer tensor."""
        return self._op("BitwiseNot", args, {}, debugContext)[0]

    def bitwiseand(self, args, debugContext=""):  # noqa: N803
        """``a & b`` of integer tensors, broadcasting."""
        return self._op("BitwiseAnd", args, {}, debugContext)[0]

    def bitwiseor(self, args, debugContext=""):  # noqa: N803
        """``a | b`` of integer tensors, broadcasting."""
        return self._op("BitwiseOr", args, {}, debugContext)[0]

    def bitwisexor(self, args, debugContext=""):  # noqa: N803
        """``a ^ b`` of integer tensors, broadcasting."""
        return self._op("BitwiseXor", args, {}, debugContext)[0]

    def bitwisexnor(self, args, debugContext=""):  # noqa: N803
        """``~(a ^ b)`` of integer tensors, broadcasting."""
        return self._op("BitwiseXnor", args, {}, debugContext)[0]

    # -- normalisation, recurrent, decoding, graph-network and packed-sequence ops --------------
    def _known(self, args) -> list:
        """``(dtype name, shape)`` of each id in ``args`` ("" or unknown: None)."""
        return [self._builder._infos.get(a) if a else None for a in args]

    @staticmethod
    def _setup(fn, *a):
        """Run an op's setup check (``graphcore_ops.*_setup``): its ``ValueError`` becomes
        PopART's ``popart_exception``."""
        try:
            return fn(*a)
        except ValueError as e:
            raise popart_exception(str(e)) from None

    def batchnormalization(self, args, num_outputs, epsilon=1e-5, momentum=0.9, debugContext=""):  # noqa: N803
        """PopART's batch normalisation (``ai.graphcore`` BatchNormalization): ONNX
        BatchNormalization-9 whose batch variance is the unbiased one (``N - 1``, PyTorch's running
        variance). ``args = [x [N, C, ...], scale [C], B [C], mean [C], var [C]]``. One output
        (inference: ``y`` from ``mean`` / ``var``) or five (training: ``[y, running mean, running
        var, saved mean, saved var]``, ``running = (1 - momentum) * batch + momentum * input``);
        a training session copies the running statistics into ``mean`` / ``var`` when they are
        weights. Returns the list of output ids."""
        args = _tensor_ids("BatchNormalization", args)
        n = int(num_outputs)
        if not 1 <= n <= 5:
            raise popart_exception(f"BatchNormalization: num_outputs must be between 1 and 5, got {num_outputs}")
        known = self._known(args)
        out_infos = None
        if len(args) == 5 and all(k is not None and k[1] is not None for k in known):
            names = ("X", "scale", "B", "mean", "var")
            self._setup(gco.batch_norm_setup, known[0][1], {nm: k[1] for nm, k in zip(names[1:], known[1:])}, True)
            out_infos = [known[0], known[3], known[4], known[3], known[4]][:n]
        return self._op("BatchNormalization", args, {"epsilon": float(epsilon), "momentum": float(momentum)},
                        debugContext, n=n, out_infos=out_infos)

    def lstm(self, args, outputFullSequence=1, debugContext=""):  # noqa: N803
        """PopART's LSTM (``PopartLSTMOp``, the layout of popnn's LSTM): ``args = [X [seq,
        batch, input], weights [4, input + hidden, hidden](, biases [4, hidden](, initialState [2,
        batch, hidden](, seq_lens [batch] INT32)))]``, gates in the order forget, input, candidate,
        output; ``initialState`` holds the output ``h`` then the cell state ``c`` (zeros when
        omitted). Returns ``[output, cell_state]``: the output ``[seq, batch, hidden]`` when
        ``outputFullSequence`` (default) else the last one ``[batch, hidden]``, the last cell state
        ``[batch, hidden]``."""
        args = _tensor_ids("LSTM", args)
        known = self._known(args)
        out_infos = None
        if len(args) >= 2 and all(k is not None and k[1] is not None for k in known[:4]):
            shapes = [k[1] for k in known] + [None] * (4 - len(known))
            self._setup(gco.lstm_setup, shapes[0], shapes[1], shapes[2], shapes[3])
            (dt, xs), h = known[0], shapes[1][2]
            out_infos = [(dt, [xs[0], xs[1], h] if int(outputFullSequence) else [xs[1], h]), (dt, [xs[1], h])]
        return self._op("LSTM", args, {"output_full_sequence": int(outputFullSequence)}, debugContext, n=2,
                        out_infos=out_infos)

    def ctcbeamsearchdecoder(self, args, blank=0, beam_width=100, top_paths=1, debug_context=""):
        """Connectionist temporal classification beam search decoder (popnn's
        ``beamSearchDecoderLogProbabilities``): ``args = [logProbs [maxTime, batch, classes] float,
        dataLengths [batch] UINT32]``. Returns ``[labelProbs [batch, top_paths] (log
        probabilities, logProbs' type), labelLengths [batch, top_paths] UINT32, decodedLabels
        [batch, top_paths, maxTime] UINT32]``, most probable path first; ``top_paths`` must not
        exceed ``beam_width``."""
        args = _tensor_ids("CtcBeamSearchDecoder", args)
        if int(beam_width) < 1 or not 1 <= int(top_paths) <= int(beam_width):
            raise popart_exception(f"CtcBeamSearchDecoder: top_paths ({top_paths}) must be between 1 and beam_width "
                                   f"({beam_width})")
        known = self._known(args)
        out_infos = None
        if len(args) == 2 and all(k is not None and k[1] is not None for k in known):
            name = f"{debug_context or 'CtcBeamSearchDecoder'} (ai.graphcore.CtcBeamSearchDecoder:1)"
            self._setup(gco.ctc_beam_search_setup, known[0][1], known[0][0], known[1][1], known[1][0], name)
            t, n, _ = known[0][1]
            p = int(top_paths)
            out_infos = [(known[0][0], [n, p]), ("UINT32", [n, p]), ("UINT32", [n, p, t])]
        attrs = {"blank": int(blank), "beam_width": int(beam_width), "top_paths": int(top_paths)}
        return self._op("CtcBeamSearchDecoder", args, attrs, debug_context, n=3, out_infos=out_infos)

    def groupedscatterreduce(self, args, axis_size, axis=-1, reduction="Sum", group_size=1,  # noqa: N803
                             enable_index_broadcast=1, debugContext=""):
        """``scatterreduce`` per group: ``args = [src [group_size, ...], index [group_size, ...](,
        initial)]``, group ``g`` reducing ``src[g]`` into ``out[g]`` along ``axis`` (an axis of
        ``src``, not the group axis 0); ``out[g][.., i, ..] = reduce(src[g][index[g] == i])``. A
        ``[group_size, n]`` index broadcasts along ``axis`` when ``enable_index_broadcast``."""
        red = str(reduction).split(".")[-1]
        if red.lower() not in _SCATTER_REDUCTIONS:
            raise popart_exception(f"Unknown ScatterReduction '{reduction}'. Use one of Sum, Max, Min, Mul, "
                                   "NoReduction")
        attrs = {"axis_size": int(axis_size), "axis": int(axis), "reduction": _SCATTER_REDUCTIONS[red.lower()],
                 "group_size": int(group_size), "enable_index_broadcast": int(enable_index_broadcast)}
        for name in ("axis_size", "group_size"):
            if attrs[name] < 1:
                raise popart_exception(f"ScatterReduceOp {name} = {attrs[name]} is not valid: must be > 0.")
        if attrs["enable_index_broadcast"] not in (0, 1):
            raise popart_exception(f"ScatterReduceOp enable_index_broadcast = {enable_index_broadcast} is not valid: "
                                   "must be either 0 or 1.")
        known = self._known(_tensor_ids("ScatterReduce", args))
        if known and known[0] is not None and known[0][1] is not None:
            self._setup(gco.scatter_reduce_setup, known[0][1], attrs)
        return self._op("ScatterReduce", args, attrs, debugContext)[0]

    def replicatedreducescatter(self, args, collectiveOperator=None, commGroup=None, debugContext=""):  # noqa: N803
        """The input flattened, reduced over the replicas of its group (``collectiveOperator``,
        default Add) and scattered: the replica at position ``q`` of its group gets elements
        ``[q k, (q + 1) k)`` of the group's result, ``k = ceil(n / p)`` for ``p`` replicas in the
        group (zero-padded), as a ``[k]`` tensor (PopART's ``ReplicatedReduceScatterOp``: its
        size is the comm group's). ``commGroup`` (:class:`popart.CommGroup`, default all
        replicas): ``Consecutive`` / ``Orthogonal`` groups of ``replicaGroupSize``,
        ``Ungrouped`` groups of one (the flattened input); kept as the op's ``commGroup``
        attribute ``[type, size]``. The output's shape depends on the session's replication
        factor, so the builder records none (the session infers it); with one replica it is
        the flattened input."""
        op, debugContext = _collective(collectiveOperator, debugContext, "replicatedreducescatter")
        attrs = {"op": op, **_comm_group_attr(commGroup, "replicatedreducescatter")}
        return self._op("ReplicatedReduceScatter", args, attrs, debugContext, out_infos=[None])[0]

    def splinebasis(self, args, degree=1, debugContext=""):  # noqa: N803
        """B-spline basis of PyTorch Geometric's SplineConv (``popops::splineBasis``): ``args =
        [pseudo [E, D] float, kernel_size [D] INT32, is_open_spline [D] UINT8]``. Returns ``[basis
        [E, S], weight_index [E, S] INT32]``, ``S = (degree + 1)^D``: the basis coefficients and
        the weight index of each spline. ``degree`` 0 .. 3 (popops computes 1, 2 and 3)."""
        if not 0 <= int(degree) <= 3:
            raise popart_exception(f"SplineBasisOp degree = {degree} is not valid: must be between 0 and 3.")
        args = _tensor_ids("SplineBasis", args)
        known = self._known(args)
        out_infos = None
        if len(args) == 3 and all(k is not None and k[1] is not None for k in known):
            self._setup(gco.spline_basis_setup, known[0][1], known[1][1], known[2][1])
            e, d = known[0][1]
            s = (int(degree) + 1) ** d
            out_infos = [(known[0][0], [e, s]), (known[1][0], [e, s])]
        return self._op("SplineBasis", args, {"degree": int(degree)}, debugContext, n=2, out_infos=out_infos)

    def splineweighting(self, args, debugContext=""):  # noqa: N803
        """Features weighted by the B-spline kernel (``popops::splineWeighting``): ``args = [input
        [E, Cin], weight [K, Cin, Cout], basis [E, S], weightIndex [E, S] INT32]`` (basis and
        weightIndex from ``splinebasis``); ``out[e] = sum_s basis[e, s] input[e] @
        weight[weightIndex[e, s]]``, ``[E, Cout]``."""
        args = _tensor_ids("SplineWeighting", args)
        known = self._known(args)
        out_infos = None
        if len(args) == 4 and all(k is not None and k[1] is not None for k in known):
            self._setup(gco.spline_weighting_setup, *[k[1] for k in known], known[0][0], known[1][0], known[2][0])
            out_infos = [(known[0][0], [known[0][1][0], known[1][1][2]])]
        return self._op("SplineWeighting", args, {}, debugContext, out_infos=out_infos)[0]

    def packedDataBlock(self, args, maxSequenceLengths, resultSize, callbackBatchSize, callback,  # noqa: N802,N803
                        debugName=""):
        """Run ``callback`` (a subgraph builder) on unpacked sequences (PopART's
        ``PackedDataBlockOp``). ``args = [data_0, offsets_0, lengths_0, ..., resultOffsets,
        resultLengths]``: sequence ``j`` of input ``i`` is ``data_i[offsets_i[j] : +
        lengths_i[j]]``, zero-padded to ``maxSequenceLengths[i]``; the callback takes
        ``callbackBatchSize`` such sequences of each input (``[callbackBatchSize,
        maxSequenceLengths[i], ...]``) and returns ``[callbackBatchSize, L, ...]``, whose first
        ``resultLengths[j]`` rows for sequence ``j`` are written at row ``resultOffsets[j]`` of the
        result ``[resultSize, ...]`` (zeros elsewhere). Returns the result id."""
        from openipu.popart.builder import Builder

        if not isinstance(callback, Builder) or callback._parent is None:
            raise popart_exception("packedDataBlock: callback must be a subgraph builder "
                                   "(builder.createSubgraphBuilder())")
        args = _tensor_ids("PackedDataBlock", args)
        lens = [int(m) for m in maxSequenceLengths]
        if len(args) < 5 or (len(args) - 2) % 3 or len(lens) != (len(args) - 2) // 3:
            raise popart_exception(f"packedDataBlock: {len(args)} inputs for {len(lens)} maxSequenceLengths: give "
                                   "[data, offsets, lengths] per data input, then [resultOffsets, resultLengths], "
                                   "and one maxSequenceLength per data input")
        if int(callbackBatchSize) < 1:
            raise popart_exception(f"packedDataBlock: callbackBatchSize must be positive, got {callbackBatchSize}")
        g = callback._model.graph
        if len(g.input) != len(lens) or len(g.output) != 1:
            raise popart_exception(f"packedDataBlock: the callback has {len(g.input)} inputs and {len(g.output)} "
                                   f"outputs; it needs one input per data input ({len(lens)}) and one output")
        attrs = {"maxSequenceLengths": lens, "resultSize": int(resultSize),
                 "callbackBatchSize": int(callbackBatchSize), "callback": callback}
        return self._op("PackedDataBlock", args, attrs, debugName,
                        out_infos=[self._packed_info(args, attrs, callback)])[0]

    def _packed_info(self, args, attrs, callback):
        """The result's ``(dtype, shape)``: the callback run on zeros of its input shapes, or None."""
        known = self._known(args)
        if any(k is None or k[1] is None for k in known):
            return None
        from openipu.popart.shapes import probe
        b = self._builder._root()
        opsets = {"": b._opset_versions.get("ai.onnx", b._default_onnx), **{
            k: v for k, v in b._opset_versions.items() if k != "ai.onnx"}}
        a = {k: v for k, v in attrs.items() if k != "callback"}
        a.update(callback=callback._model.graph, __opsets__=opsets, __outer__={})
        try:
            return probe(find_kernel(GRAPHCORE, "PackedDataBlock"), known, a, 1)[0]
        except Exception as e:  # noqa: BLE001 - left to the session's inference
            log("builder").warning("Shape inference failed for the packedDataBlock result (%s)", e)
            return None


#: input counts of the ai.graphcore ops (PopART's ``OperatorIdentifier`` NumInputs)
_GC_ARITY = {
    "Gelu": (1, 1), "GeluErf": (1, 1), "Swish": (1, 1), "Scale": (1, 1), "ScaledAdd": (2, 4), "Detach": (1, 1),
    "Nop": (1, 1), "PrintTensor": (1, 1), "TensorRemap": (1, 2), "ReplicatedAllReduce": (1, 1),
    "IncrementMod": (1, 1), "CopyVarUpdate": (2, 2), "Abort": (0, 1), "IdentityLoss": (1, 1),
    "Nll": (2, 2), "L1": (1, 1), "Ctc": (4, 4), "Reshape": (1, 1), "Subsample": (1, 1), "Reverse": (1, 1),
    "Slice": (1, 1), "DepthToSpace": (1, 1), "DynamicSlice": (2, 2), "DynamicUpdate": (3, 3),
    "DynamicZero": (2, 2), "DynamicAdd": (3, 3), "SequenceSlice": (5, 5), "Init": (0, 0),
    "GroupNormalization": (3, 3), "ReduceMedian": (1, 1), "ScatterReduce": (2, 3), "GroupedGather": (2, 2),
    "Sort": (1, 1), "Bucketize": (2, 2), "NormalizeImage": (3, 3), "ShapedDropout": (1, 1),
    "Round": (1, 1), "Nearbyint": (1, 1), "Fmod": (2, 2), "Remainder": (2, 2), "Atan2": (2, 2), "Expm1": (1, 1),
    "Log1p": (1, 1), "BitwiseNot": (1, 1), "BitwiseAnd": (2, 2), "BitwiseOr": (2, 2), "BitwiseXor": (2, 2),
    "BitwiseXnor": (2, 2), "BatchNormalization": (5, 5), "LSTM": (2, 5), "CtcBeamSearchDecoder": (2, 2),
    "ReplicatedReduceScatter": (1, 1), "SplineBasis": (3, 3), "SplineWeighting": (4, 4),
}
#: PopART's C++ ``DataType`` enum order (the ``data_type`` attribute of Init)
_DATA_TYPES = ["UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "UINT32", "UINT64", "BOOL", "FLOAT", "FLOAT16",
               "BFLOAT16", "FLOAT8_143", "FLOAT8_152", "DOUBLE", "COMPLEX64", "COMPLEX128", "STRING", "UNDEFINED"]
_SCATTER_REDUCTIONS = {"sum": "sum", "max": "max", "min": "min", "mul": "mul", "noreduction": "none", "none": "none"}
_COLLECTIVE_OPS = ("Add", "Mean", "Mul", "Min", "Max", "LogicalAnd", "LogicalOr", "SquareAdd", "Local")


def _comm_group_attr(comm_group, what: str) -> dict:
    """A collective builder op's ``commGroup`` attribute: ``{"commGroup": [type, size]}`` (PopART's
    ``__collectiveCommGroup``: CommGroupType All 0, Consecutive 1, Orthogonal 2, None 3), or {}
    for all replicas. Raises ``popart_exception`` for something that is not a
    ``popart.CommGroup``."""
    if comm_group is None:
        return {}
    from openipu.popart.variable_settings import _TYPES, CommGroup
    if not isinstance(comm_group, CommGroup):
        raise popart_exception(f"{what}: commGroup must be a popart.CommGroup, got {type(comm_group).__name__}")
    if str(comm_group.type) == "All":
        return {}
    return {"commGroup": [_TYPES.index(str(comm_group.type)), int(comm_group.replicaGroupSize)]}


def _comm_group_of_list(value):
    """The ``popart.CommGroup`` of a ``[type, size]`` list (the deprecated builder form)."""
    from openipu.popart.variable_settings import _TYPES, CommGroup
    if len(value) != 2 or not 0 <= int(value[0]) < len(_TYPES):
        raise popart_exception(f"replicatedallreduce: commGroup must be [type, replicaGroupSize] with a "
                               f"CommGroupType value 0..3, got {list(value)}")
    from openipu.popart.options import CommGroupType
    return CommGroup(getattr(CommGroupType, _TYPES[int(value[0])]), int(value[1]))


def _collective(operator, debug_context, what: str):
    """``(operator name, debugContext)`` of a collective builder op: the operator (default Add;
    a lone string that is no operator is the debugContext, PopART's positional form). Raises
    ``popart_exception`` for an unknown operator."""
    if isinstance(operator, str) and not debug_context and operator not in _COLLECTIVE_OPS:
        operator, debug_context = None, operator
    op = str(operator or "Add").split(".")[-1]
    if op not in _COLLECTIVE_OPS:
        raise popart_exception(f"Unsupported collective operator '{operator}' for {what}. Use one of "
                               f"{', '.join(_COLLECTIVE_OPS)}")
    return op, debug_context


def _tensor_ids(op: str, args) -> list:
    if isinstance(args, str) or not isinstance(args, (list, tuple)):
        raise popart_exception(f"{op}: args must be a list of tensor ids, got {type(args).__name__} {args!r}")
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise popart_exception(f"{op}: args must be tensor ids (str), got {bad[0]!r}")
    return list(args)


def _reduction(reduction) -> int:
    name = str(reduction).split(".")[-1]
    if name not in _REDUCTION:
        raise popart_exception(f"Unknown ReductionType '{reduction}': use popart.ReductionType.Sum, Mean or "
                               "NoReduction")
    return _REDUCTION[name]


def _dyn_attrs(axes, sizes, no_overlap=None) -> dict:
    axes, sizes = [int(a) for a in axes], [int(s) for s in sizes]
    if len(axes) != len(sizes):
        raise popart_exception(f"DynamicBaseOp: axes {axes} and sizes {sizes} must have the same length")
    a = {"axes": axes, "sizes": sizes}
    if no_overlap is not None:
        a["noOverlap"] = int(no_overlap)
    return a


def _data_type_code(dt) -> int:
    if isinstance(dt, (int, np.integer)) and not isinstance(dt, bool):
        if not 0 <= int(dt) < len(_DATA_TYPES):
            raise popart_exception(f"Init: unknown data_type {dt}")
        return int(dt)
    name = dtype_name(dt) if not isinstance(dt, str) else dt.upper()
    name = {"FLOAT32": "FLOAT", "HALF": "FLOAT16", "INT": "INT32"}.get(name, name)
    if name not in _DATA_TYPES:
        raise popart_exception(f"Init: unknown data_type {dt}")
    return _DATA_TYPES.index(name)


def _init_type(it) -> int:
    if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
        return int(it)
    name = str(it).split(".")[-1]
    if name not in ("NoInit", "Zero"):
        raise popart_exception(f"Init: unknown init_type {it} (InitType.NoInit or InitType.Zero)")
    return 0 if name == "NoInit" else 1

