"""``poplin::ConvParams``: the shape of a convolution and its input / kernel / output transforms.

Mirrors PopLibs ``include/poplin/ConvParams.hpp`` (field names and the order in which transforms
apply) and ``poplin::getGradientParams`` (``include/poplin/ConvUtil.hpp``). Sizes are elements.

Per spatial dimension the input goes through: truncation (lower / upper), dilation (``d - 1`` zeros
between elements), padding (lower / upper zeros), flip. The kernel goes through the same steps.
The convolution (a correlation with stride 1, no padding) of the transformed input with the
transformed kernel gives ``transformedInput - transformedKernel + 1`` elements, which then go
through the output transform: truncation, striding, padding.
"""

from __future__ import annotations

from dataclasses import dataclass

from openipu import poplar
from openipu.poplar.types import as_type


class poplibs_error(poplar.poplar_error):  # noqa: N801 - PopLibs spelling
    """PopLibs' exception (``poputil::poplibs_error``). A subclass of ``poplar_error`` here, so
    ``except poplar.poplar_error`` catches library errors too."""


def _vec(v, n, default, name):
    if v is None:
        return [default] * n
    v = [type(default)(x) for x in v]
    if len(v) != n:
        raise poplibs_error(f"ConvParams: {name} has {len(v)} entries but the field has {n} dimensions")
    return v


@dataclass
class InputTransform:
    """``ConvParams::InputTransform``: applied to the input (or kernel) field, in this order:
    truncation, dilation, padding, flip. Lists have one entry per spatial dimension."""

    truncationLower: list = None
    truncationUpper: list = None
    dilation: list = None
    paddingLower: list = None
    paddingUpper: list = None
    flip: list = None

    def _fill(self, n: int) -> "InputTransform":
        return InputTransform(_vec(self.truncationLower, n, 0, "truncationLower"),
                              _vec(self.truncationUpper, n, 0, "truncationUpper"),
                              _vec(self.dilation, n, 1, "dilation"),
                              _vec(self.paddingLower, n, 0, "paddingLower"),
                              _vec(self.paddingUpper, n, 0, "paddingUpper"),
                              _vec(self.flip, n, False, "flip"))

    def key(self) -> tuple:
        return tuple(tuple(x) for x in (self.truncationLower, self.truncationUpper, self.dilation,
                                        self.paddingLower, self.paddingUpper, self.flip))


@dataclass
class OutputTransform:
    """``ConvParams::OutputTransform``: truncation, then striding, then padding."""

    truncationLower: list = None
    truncationUpper: list = None
    stride: list = None
    paddingLower: list = None
    paddingUpper: list = None

    def _fill(self, n: int) -> "OutputTransform":
        return OutputTransform(_vec(self.truncationLower, n, 0, "truncationLower"),
                               _vec(self.truncationUpper, n, 0, "truncationUpper"),
                               _vec(self.stride, n, 1, "stride"),
                               _vec(self.paddingLower, n, 0, "paddingLower"),
                               _vec(self.paddingUpper, n, 0, "paddingUpper"))

    def key(self) -> tuple:
        return tuple(tuple(x) for x in (self.truncationLower, self.truncationUpper, self.stride,
                                        self.paddingLower, self.paddingUpper))


def _transformed(size: int, tr: InputTransform, d: int) -> int:
    t = size - tr.truncationLower[d] - tr.truncationUpper[d]
    dil = (t - 1) * tr.dilation[d] + 1 if t > 0 else 0
    return dil + tr.paddingLower[d] + tr.paddingUpper[d]


class ConvParams:
    """``poplin::ConvParams``.

    Forms (as PopLibs)::

        ConvParams(dataType, batchSize, inputFieldShape, kernelShape,
                   inputChannelsPerConvGroup, outputChannelsPerConvGroup, numConvGroups)
        ConvParams(inputType, outputType, batchSize, inputFieldShape, kernelShape,
                   inputChannelsPerConvGroup, outputChannelsPerConvGroup, numConvGroups,
                   inputTransform=None, kernelTransform=None, outputTransform=None)

    The input tensor of a convolution is ``[batchSize, numConvGroups * inputChannelsPerConvGroup,
    *inputFieldShape]``, the weights ``[numConvGroups, outputChannelsPerConvGroup,
    inputChannelsPerConvGroup, *kernelShape]``, the output ``[batchSize, numConvGroups *
    outputChannelsPerConvGroup, *getOutputFieldShape()]``.

    Raises:
        poplibs_error: transform lists of the wrong length, a kernel larger than the input after
            transforms, or non-positive sizes (see :meth:`validate`).
    """

    def __init__(self, *args, inputTransform=None, kernelTransform=None, outputTransform=None):  # noqa: N803
        args = list(args)
        if len(args) >= 2 and isinstance(args[1], (poplar.Type, str)) and not isinstance(args[1], (list, tuple)):
            in_t, out_t, rest = as_type(args[0]), as_type(args[1]), args[2:]
        else:
            in_t = out_t = as_type(args[0])
            rest = args[1:]
        if len(rest) < 6:
            raise poplibs_error("ConvParams needs (dataType, batchSize, inputFieldShape, kernelShape, "
                                "inputChannelsPerConvGroup, outputChannelsPerConvGroup, numConvGroups)")
        if len(rest) >= 9:
            inputTransform, kernelTransform, outputTransform = rest[6:9]
        self.inputType, self.outputType = in_t, out_t
        self.batchSize = int(rest[0])
        self.inputFieldShape = [int(x) for x in rest[1]]
        self.kernelShape = [int(x) for x in rest[2]]
        self.inputChannelsPerConvGroup = int(rest[3])
        self.outputChannelsPerConvGroup = int(rest[4])
        self.numConvGroups = int(rest[5])
        n = len(self.inputFieldShape)
        if len(self.kernelShape) != n:
            raise poplibs_error(f"ConvParams: kernel shape {self.kernelShape} has {len(self.kernelShape)} dimensions "
                                f"but the input field {self.inputFieldShape} has {n}")
        self.inputTransform = (inputTransform or InputTransform())._fill(n)
        self.kernelTransform = (kernelTransform or InputTransform())._fill(n)
        self.outputTransform = (outputTransform or OutputTransform())._fill(n)
        self.validate()

    # PopLibs getters
    @property
    def dType(self):  # noqa: N802
        return self.inputType

    def getNumFieldDims(self) -> int: return len(self.inputFieldShape)  # noqa: E704,N802
    def getBatchSize(self) -> int: return self.batchSize  # noqa: E704,N802
    def getInputSize(self, d: int) -> int: return self.inputFieldShape[d]  # noqa: E704,N802
    def getNumInputChansPerConvGroup(self) -> int: return self.inputChannelsPerConvGroup  # noqa: E704,N802
    def getNumOutputChansPerConvGroup(self) -> int: return self.outputChannelsPerConvGroup  # noqa: E704,N802
    def getNumInputChans(self) -> int: return self.inputChannelsPerConvGroup * self.numConvGroups  # noqa: E704,N802
    def getNumOutputChans(self) -> int: return self.outputChannelsPerConvGroup * self.numConvGroups  # noqa: E704,N802
    def getNumConvGroups(self) -> int: return self.numConvGroups  # noqa: E704,N802
    def getKernelShape(self) -> list: return list(self.kernelShape)  # noqa: E704,N802

    def getTruncatedInputSize(self, d: int) -> int:  # noqa: N802
        t = self.inputTransform
        return self.inputFieldShape[d] - t.truncationLower[d] - t.truncationUpper[d]

    def getTruncatedKernelSize(self, d: int) -> int:  # noqa: N802
        t = self.kernelTransform
        return self.kernelShape[d] - t.truncationLower[d] - t.truncationUpper[d]

    def getTransformedInputSize(self, d: int) -> int:  # noqa: N802
        return _transformed(self.inputFieldShape[d], self.inputTransform, d)

    def getTransformedKernelSize(self, d: int) -> int:  # noqa: N802
        return _transformed(self.kernelShape[d], self.kernelTransform, d)

    def getUntransformedOutputSize(self, d: int) -> int:  # noqa: N802
        """Output size in dimension ``d`` before the output transform."""
        return self.getTransformedInputSize(d) - self.getTransformedKernelSize(d) + 1

    def _strided_size(self, d: int) -> int:
        o = self.outputTransform
        t = self.getUntransformedOutputSize(d) - o.truncationLower[d] - o.truncationUpper[d]
        return (t + o.stride[d] - 1) // o.stride[d] if t > 0 else 0

    def getOutputSize(self, d: int) -> int:  # noqa: N802
        o = self.outputTransform
        return self._strided_size(d) + o.paddingLower[d] + o.paddingUpper[d]

    def getOutputFieldShape(self) -> list:  # noqa: N802
        return [self.getOutputSize(d) for d in range(self.getNumFieldDims())]

    def getInputShape(self) -> list:  # noqa: N802
        """``[batchSize, numInputChans, *inputFieldShape]`` (the tensor ``convolution`` takes)."""
        return [self.batchSize, self.getNumInputChans(), *self.inputFieldShape]

    def getWeightsShape(self) -> list:  # noqa: N802
        return [self.numConvGroups, self.outputChannelsPerConvGroup, self.inputChannelsPerConvGroup, *self.kernelShape]

    def getOutputShape(self) -> list:  # noqa: N802
        return [self.batchSize, self.getNumOutputChans(), *self.getOutputFieldShape()]

    def validate(self) -> None:
        """Raise :class:`poplibs_error` if the parameters do not describe a convolution."""
        what = f"ConvParams {self}"
        if self.batchSize < 1 or self.inputChannelsPerConvGroup < 1 or self.outputChannelsPerConvGroup < 1 \
                or self.numConvGroups < 1:
            raise poplibs_error(f"{what}: batch size, channels and groups must be at least 1")
        if self.getNumFieldDims() > 3:
            raise poplibs_error(f"{what}: at most 3 spatial dimensions are supported")
        for d in range(self.getNumFieldDims()):
            for tr, size, nm in ((self.inputTransform, self.inputFieldShape[d], "input"),
                                 (self.kernelTransform, self.kernelShape[d], "kernel")):
                if size < 1:
                    raise poplibs_error(f"{what}: {nm} size {size} in dimension {d} must be at least 1")
                if tr.truncationLower[d] + tr.truncationUpper[d] > size:
                    raise poplibs_error(f"{what}: {nm} truncation exceeds its size in dimension {d}")
                if tr.dilation[d] < 1:
                    raise poplibs_error(f"{what}: {nm} dilation must be at least 1")
            if self.outputTransform.stride[d] < 1:
                raise poplibs_error(f"{what}: stride must be at least 1")
            if self.getTransformedKernelSize(d) < 1:
                raise poplibs_error(f"{what}: the transformed kernel is empty in dimension {d}")
            if self.getUntransformedOutputSize(d) < 1:
                raise poplibs_error(
                    f"{what}: in dimension {d} the transformed kernel ({self.getTransformedKernelSize(d)}) is larger "
                    f"than the transformed input ({self.getTransformedInputSize(d)}); add input padding")
            o = self.outputTransform
            if o.truncationLower[d] + o.truncationUpper[d] > self.getUntransformedOutputSize(d):
                raise poplibs_error(f"{what}: output truncation exceeds the output size in dimension {d}")

    def key(self) -> tuple:
        return (self.inputType.name, self.outputType.name, self.batchSize, tuple(self.inputFieldShape),
                tuple(self.kernelShape), self.inputChannelsPerConvGroup, self.outputChannelsPerConvGroup,
                self.numConvGroups, self.inputTransform.key(), self.kernelTransform.key(), self.outputTransform.key())

    def __eq__(self, other):
        return isinstance(other, ConvParams) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        s = (f"{{{self.inputType}->{self.outputType}, batch {self.batchSize}, field {self.inputFieldShape}, "
             f"kernel {self.kernelShape}, chans {self.inputChannelsPerConvGroup}->{self.outputChannelsPerConvGroup}, "
             f"groups {self.numConvGroups}")
        it, kt, ot = self.inputTransform, self.kernelTransform, self.outputTransform
        n = self.getNumFieldDims()
        if it.key() != InputTransform()._fill(n).key():
            s += f", inputTransform {it}"
        if kt.key() != InputTransform()._fill(n).key():
            s += f", kernelTransform {kt}"
        if ot.key() != OutputTransform()._fill(n).key():
            s += f", outputTransform {ot}"
        return s + "}"

    __str__ = __repr__

    def canonicalize(self) -> "ConvParams":
        """Equivalent params whose output truncation leaves no element that striding drops
        (``canonicalizeParams``): the ignored tail moves into ``outputTransform.truncationUpper``."""
        ot = self.outputTransform
        tu = list(ot.truncationUpper)
        for d in range(self.getNumFieldDims()):
            t = self.getUntransformedOutputSize(d) - ot.truncationLower[d] - tu[d]
            if t > 0:
                tu[d] += (t - 1) % ot.stride[d]
        return self._with(outputTransform=OutputTransform(list(ot.truncationLower), tu, list(ot.stride),
                                                          list(ot.paddingLower), list(ot.paddingUpper)))

    def _with(self, **kw) -> "ConvParams":
        a = dict(inputType=self.inputType, outputType=self.outputType, batchSize=self.batchSize,
                 inputFieldShape=self.inputFieldShape, kernelShape=self.kernelShape,
                 inputChannelsPerConvGroup=self.inputChannelsPerConvGroup,
                 outputChannelsPerConvGroup=self.outputChannelsPerConvGroup, numConvGroups=self.numConvGroups,
                 inputTransform=self.inputTransform, kernelTransform=self.kernelTransform,
                 outputTransform=self.outputTransform)
        a.update(kw)
        return ConvParams(a["inputType"], a["outputType"], a["batchSize"], a["inputFieldShape"], a["kernelShape"],
                          a["inputChannelsPerConvGroup"], a["outputChannelsPerConvGroup"], a["numConvGroups"],
                          inputTransform=a["inputTransform"], kernelTransform=a["kernelTransform"],
                          outputTransform=a["outputTransform"])


def getGradientParams(params: ConvParams) -> ConvParams:  # noqa: N802
    """The convolution that maps output gradients to input gradients (``poplin::getGradientParams``).

    Use it with ``convolution(graph, zDeltas, weights, getGradientParams(fwd), True, ...)``: the
    forward weights ``[G, Co, Ci, *K]`` are transposed and flipped by ``transposeAndFlipWeights``.
    The valid forward correlation becomes a full one: the output-gradient field is dilated by the
    forward stride and padded by ``transformedKernelSize - 1``; the forward input padding becomes
    output truncation, input dilation becomes stride and input truncation becomes output padding.
    """
    p = params.canonicalize()
    n = p.getNumFieldDims()
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    k = [p.getTransformedKernelSize(d) for d in range(n)]
    flip_in = [False] * n
    flip_k = list(kt.flip)
    for d in range(n):
        if it.flip[d]:
            flip_in[d] = True
            flip_k[d] = not flip_k[d]
    bwd_in = InputTransform(list(ot.paddingLower), list(ot.paddingUpper), list(ot.stride),
                            [ot.truncationLower[d] + k[d] - 1 for d in range(n)],
                            [ot.truncationUpper[d] + k[d] - 1 for d in range(n)], flip_in)
    bwd_k = InputTransform(list(kt.truncationUpper), list(kt.truncationLower), list(kt.dilation),
                           list(kt.paddingUpper), list(kt.paddingLower), flip_k)
    bwd_out = OutputTransform(list(it.paddingLower), list(it.paddingUpper), list(it.dilation),
                              list(it.truncationLower), list(it.truncationUpper))
    return ConvParams(p.inputType, p.outputType, p.batchSize, p.getOutputFieldShape(), p.kernelShape,
                      p.outputChannelsPerConvGroup, p.inputChannelsPerConvGroup, p.numConvGroups,
                      inputTransform=bwd_in, kernelTransform=bwd_k, outputTransform=bwd_out)


def weight_update_params(params: ConvParams) -> ConvParams:
    """The convolution that gives weight gradients (PopLibs' internal ``getWeightUpdateParams``).

    Activations ``[N, G*Ci, *F]`` act as an input with batch ``Ci`` and ``N`` channels; output
    gradients ``[N, G*Co, *Fo]`` act as the kernel (``Co`` out, ``N`` in channels), dilated by the
    forward stride; the output field is the kernel: its dilation becomes the stride.

    Raises:
        poplibs_error: a flipped kernel or input (not supported for the weight update here).
    """
    p = params.canonicalize()
    n = p.getNumFieldDims()
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    if any(kt.flip) or any(it.flip):
        raise poplibs_error(f"calculateWeightDeltas: flipped inputs or kernels are not supported ({params})")
    full = [p.getUntransformedOutputSize(d) for d in range(n)]
    strided = [p._strided_size(d) for d in range(n)]
    k_pad_upper = [full[d] - ot.truncationLower[d] - ((strided[d] - 1) * ot.stride[d] + 1) for d in range(n)]
    wu_k = InputTransform(list(ot.paddingLower), list(ot.paddingUpper), list(ot.stride),
                          list(ot.truncationLower), k_pad_upper, [False] * n)
    wu_out = OutputTransform(list(kt.paddingLower), list(kt.paddingUpper), list(kt.dilation),
                             list(kt.truncationLower), list(kt.truncationUpper))
    return ConvParams(p.inputType, p.outputType, p.inputChannelsPerConvGroup, p.inputFieldShape,
                      p.getOutputFieldShape(), p.batchSize, p.outputChannelsPerConvGroup, p.numConvGroups,
                      inputTransform=it, kernelTransform=wu_k, outputTransform=wu_out)
