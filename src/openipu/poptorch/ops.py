"""PopTorch's ops (``poptorch/ops.py``; ``research/poptorch.md`` 1.10). Each runs as the identity
(or its plain PyTorch meaning) on the CPU and is a ``torch.ops.poptorch.*`` node in the captured
graph, lowered to its PopART op (:mod:`openipu.poptorch.lower.poptorch_ops`)."""

from __future__ import annotations

import json

import torch

from openipu.poptorch.errors import Error

_REDUCTIONS = {"sum": 2, "mean": 1, "none": 0}


def _identity_op(name: str, schema_args: str = ""):
    """A custom op ``poptorch::<name>(Tensor x<schema_args>) -> Tensor`` that returns a copy of
    ``x`` (a fresh tensor, so capture keeps it)."""
    lib_name = f"poptorch::{name}"
    torch.library.define(lib_name, f"(Tensor x{schema_args}) -> Tensor")

    @torch.library.impl(lib_name, "CompositeExplicitAutograd")
    def _impl(x, *args):
        return x.clone()

    @torch.library.register_fake(lib_name)
    def _fake(x, *args):
        return torch.empty_like(x)

    def _backward(ctx, grad):
        return (grad,) + (None,) * ctx.n_extra

    def _setup(ctx, inputs, output):
        ctx.n_extra = len(inputs) - 1

    torch.library.register_autograd(lib_name, _backward, setup_context=_setup)
    return getattr(torch.ops.poptorch, name)


_nop = _identity_op("nop")
_print = _identity_op("ipu_print_tensor", ", str title, int print_gradient")
_available_memory = _identity_op("set_available_memory", ", float proportion")
_checkpoint = _identity_op("recomputation_checkpoint")

torch.library.define("poptorch::identity_loss", "(Tensor x, int reduction) -> Tensor")


@torch.library.impl("poptorch::identity_loss", "CompositeExplicitAutograd")
def _identity_loss_impl(x, reduction):
    return x.sum() if reduction == 2 else x.mean() if reduction == 1 else x.clone()


@torch.library.register_fake("poptorch::identity_loss")
def _identity_loss_fake(x, reduction):
    return x.new_empty(()) if reduction in (1, 2) else torch.empty_like(x)


def _identity_loss_backward(ctx, grad):
    g = grad.expand(ctx.shape)
    return (g / ctx.numel if ctx.reduction == 1 else g if ctx.reduction == 2 else grad), None


def _identity_loss_setup(ctx, inputs, output):
    ctx.shape, ctx.numel, ctx.reduction = inputs[0].shape, max(inputs[0].numel(), 1), inputs[1]


torch.library.register_autograd("poptorch::identity_loss", _identity_loss_backward, setup_context=_identity_loss_setup)


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` as the model's loss, reduced by ``reduction`` ("sum", "mean" or "none"): the
    backward pass starts here (PopTorch's ``identity_loss``)."""
    if reduction not in _REDUCTIONS:
        raise Error(f"Unknown reduction '{reduction}' for identity_loss: use 'sum', 'mean' or 'none'")
    return torch.ops.poptorch.identity_loss(x, _REDUCTIONS[reduction])


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity op PopART never removes."""
    return _nop(tensor)


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     summarise_threshold: int = 1000, edge_items: int = 3, max_line_width: int = 80,
                     digits: int = 4, float_format: str = "auto", separator: str = ", ", open_bracket: str = "(",
                     close_bracket: str = ")") -> torch.Tensor:
    """Print ``tensor`` (and its gradient) when the IPU program runs; returns it (use the return
    value, or the op is pruned)."""
    return _print(tensor, str(title), int(bool(print_gradient)))


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float) -> torch.Tensor:
    """The share of tile memory the convolution / matmul producing ``tensor`` may use for its
    temporaries (default 0.6)."""
    if not 0.0 < float(available_memory_proportion) <= 1.0:
        raise Error("available_memory_proportion must be in (0, 1]")
    return _available_memory(tensor, float(available_memory_proportion))


def recomputationCheckpoint(*tensors):  # noqa: N802
    """Checkpoint ``tensors``: recomputation in the backward pass restarts from them. Returns the
    tensors (one, or a tuple). A single list or tuple argument (e.g. an attention layer's
    ``(key, value)`` cache) is checkpointed element by element and comes back as the same type.
    Raises ``ValueError("All inputs must be tensors")`` for anything else, as PopTorch does."""
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        inner = recomputationCheckpoint(*tensors[0]) if tensors[0] else ()
        return type(tensors[0])(inner if isinstance(inner, tuple) else (inner,))
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ValueError("All inputs must be tensors")
    out = tuple(_checkpoint(t) for t in tensors)
    return out[0] if len(out) == 1 else out


_running_on_ipu = [False]


def isRunningOnIpu() -> bool:  # noqa: N802
    """True only while the model is being captured for the IPU."""
    return _running_on_ipu[0]


# ----------------------------------------------------------------------------------------------
# dynamic slices, serialised matmul
# ----------------------------------------------------------------------------------------------
torch.library.define("poptorch::dynamic_slice", "(Tensor x, int dim, Tensor start, int size, int step) -> Tensor")
torch.library.define("poptorch::dynamic_update", "(Tensor x, Tensor src, int dim, Tensor start, int size) -> Tensor")


@torch.library.impl("poptorch::dynamic_slice", "CompositeExplicitAutograd")
def _dynamic_slice_impl(x, dim, start, size, step):
    return x.narrow(dim, int(start.reshape(-1)[0]), size).clone()


@torch.library.register_fake("poptorch::dynamic_slice")
def _dynamic_slice_fake(x, dim, start, size, step):
    shape = list(x.shape)
    shape[dim] = size
    return x.new_empty(shape)


def _dynamic_slice_backward(ctx, grad):
    gx = grad.new_zeros(ctx.shape)
    gx.narrow(ctx.dim, int(ctx.start.reshape(-1)[0]), grad.shape[ctx.dim]).copy_(grad)
    return gx, None, None, None, None


def _dynamic_slice_setup(ctx, inputs, output):
    ctx.shape, ctx.dim, ctx.start = inputs[0].shape, inputs[1], inputs[2]


torch.library.register_autograd("poptorch::dynamic_slice", _dynamic_slice_backward, setup_context=_dynamic_slice_setup)


@torch.library.impl("poptorch::dynamic_update", "CompositeExplicitAutograd")
def _dynamic_update_impl(x, src, dim, start, size):
    out = x.clone()
    out.narrow(dim, int(start.reshape(-1)[0]), size).copy_(src.narrow(dim, 0, size))
    return out


@torch.library.register_fake("poptorch::dynamic_update")
def _dynamic_update_fake(x, src, dim, start, size):
    return torch.empty_like(x)


def _check_dim(t, dim, what):
    if not -t.dim() <= dim < t.dim():
        raise Error(f"{what}: dim {dim} is out of range for a tensor of rank {t.dim()}")
    return dim % t.dim()


def _start_tensor(start):
    if not isinstance(start, torch.Tensor):
        start = torch.tensor(int(start), dtype=torch.int32)
    if start.numel() != 1:
        raise Error("dynamic_slice / dynamic_update: start must hold one integer")
    if start.is_floating_point():
        raise Error("dynamic_slice / dynamic_update: start must be an integer tensor")
    return start


def dynamic_slice(tensor: torch.Tensor, dim: int, start, size: int, step: int = 1) -> torch.Tensor:
    """``tensor.narrow(dim, start, size)`` with ``start`` a tensor whose value is only known on
    the device (PopTorch's ``dynamic_slice``; ``aiGraphcore.dynamicslice``). ``size`` is static;
    ``step`` must be 1 (as in PopTorch)."""
    dim = _check_dim(tensor, dim, "dynamic_slice")
    if int(step) != 1:
        raise Error(f"dynamic_slice: only step 1 is supported (got {step})")
    if not 0 < int(size) <= tensor.shape[dim]:
        raise Error(f"dynamic_slice: size {size} must be in [1, {tensor.shape[dim]}] (the size of dim {dim})")
    return torch.ops.poptorch.dynamic_slice(tensor, dim, _start_tensor(start), int(size), int(step))


def dynamic_update(input: torch.Tensor, src: torch.Tensor, dim: int, start, size: int) -> torch.Tensor:  # noqa: A002
    """A copy of ``input`` with ``src`` written at ``start`` along ``dim`` (``size`` elements;
    ``start`` a tensor: PopTorch's ``dynamic_update``, ``aiGraphcore.dynamicupdate``)."""
    dim = _check_dim(input, dim, "dynamic_update")
    if input.dim() != src.dim() or any(a != b for i, (a, b) in enumerate(zip(input.shape, src.shape)) if i != dim):
        raise Error(f"dynamic_update: src {list(src.shape)} must match input {list(input.shape)} except in dim {dim}")
    if not 0 < int(size) <= src.shape[dim]:
        raise Error(f"dynamic_update: size {size} must be in [1, {src.shape[dim]}] (src's size in dim {dim})")
    return torch.ops.poptorch.dynamic_update(input, src, dim, _start_tensor(start), int(size))


torch.library.define("poptorch::ctc_beam_search_decoder",
                     "(Tensor probs, Tensor lengths, int blank, int beam_width, int top_paths) -> (Tensor, Tensor, Tensor)")


@torch.library.impl("poptorch::ctc_beam_search_decoder", "CompositeExplicitAutograd")
def _ctc_beam_search_decoder_impl(probs, lengths, blank, beam_width, top_paths):
    from openipu.popart.graphcore_ops.ctc import ctc_prefix_beam_search
    p, n, labels = ctc_prefix_beam_search(probs, lengths.to(torch.int64), int(blank), int(beam_width), int(top_paths))
    return p.to(probs.dtype), n.to(torch.int32), labels.to(torch.int32)


@torch.library.register_fake("poptorch::ctc_beam_search_decoder")
def _ctc_beam_search_decoder_fake(probs, lengths, blank, beam_width, top_paths):
    t, b = probs.shape[0], probs.shape[1]
    return (probs.new_empty((b, top_paths)), probs.new_empty((b, top_paths), dtype=torch.int32),
            probs.new_empty((b, top_paths, t), dtype=torch.int32))


def ctc_beam_search_decoder(probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0, beam_width: int = 100,
                            top_paths: int = 1) -> list:
    """PopTorch's ``ctc_beam_search_decoder``: the ``top_paths`` most likely label sequences of a
    CTC prefix beam search of ``beam_width`` beams over log-probabilities ``probs``
    ``[input_length, batch_size, num_classes]`` (float), each batch entry's first ``lengths[b]``
    steps (``lengths`` ``[batch_size]``, integer). Returns ``[path log-probabilities [batch_size,
    top_paths] (probs' type), path lengths [batch_size, top_paths] (int32), decoded paths
    [batch_size, top_paths, input_length] (int32, zero past each path's length)]``, most probable
    first. Lowered to PopART's ``CtcBeamSearchDecoder``; not differentiable.

    Raises ``poptorch.Error`` when ``probs`` or ``lengths`` is not a tensor (PopTorch's text)."""
    if not isinstance(probs, torch.Tensor):
        raise Error(f"ctc_beam_search_decoder: probs must be a torch.tensor argument. {type(probs)} is not supported.")
    if not isinstance(lengths, torch.Tensor):
        raise Error(f"ctc_beam_search_decoder: lengths must be a torch.tensor argument. {type(lengths)} is not "
                    "supported.")
    return list(torch.ops.poptorch.ctc_beam_search_decoder(probs, lengths, int(blank), int(beam_width),
                                                           int(top_paths)))


torch.library.define("poptorch::serialized_matmul", "(Tensor a, Tensor b, str mode, int factor, bool keep) -> Tensor")


@torch.library.impl("poptorch::serialized_matmul", "CompositeExplicitAutograd")
def _serialized_matmul_impl(a, b, mode, factor, keep):
    return torch.matmul(a, b)


@torch.library.register_fake("poptorch::serialized_matmul")
def _serialized_matmul_fake(a, b, mode, factor, keep):
    return torch.matmul(a, b)


def _serialized_matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    _, vjp = torch.func.vjp(torch.matmul, a, b)
    return (*vjp(grad), None, None, None)


def _serialized_matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


torch.library.register_autograd("poptorch::serialized_matmul", _serialized_matmul_backward,
                                setup_context=_serialized_matmul_setup)


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor, mode, factor: int = 0,  # noqa: N802
                     keep_precision: bool = False) -> torch.Tensor:
    """``torch.matmul(lhs, rhs)`` computed in ``factor`` serial slices along ``mode``
    (``MatMulSerializationMode``: InputChannels, ReducingDim, OutputChannels, Disabled):
    PopART's ``setSerializeMatMul`` annotation (recorded on the MatMul)."""
    from openipu.poptorch.enums import MatMulSerializationMode
    mode = MatMulSerializationMode(mode)
    if mode != MatMulSerializationMode.Disabled and int(factor) < 1:
        raise Error("serializedMatMul: factor must be >= 1 when serialisation is enabled")
    return torch.ops.poptorch.serialized_matmul(lhs, rhs, str(mode.value), int(factor), bool(keep_precision))


# ----------------------------------------------------------------------------------------------
# custom ops: a Python kernel in place of PopART's C++ one
# ----------------------------------------------------------------------------------------------
#: (domain, name) -> kernel ``fn(inputs: list[Tensor], attributes: dict) -> Tensor | list[Tensor]``
_CUSTOM_KERNELS: dict = {}
_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.int32, torch.int64, torch.bool, torch.int8,
                               torch.uint8, torch.int16, torch.float64, torch.bfloat16)}

torch.library.define("poptorch::custom_operation",
                     "(Tensor[] inputs, str name, str domain, int domain_version, str spec) -> Tensor[]")


def _spec_outputs(spec: str):
    return [(list(shape), _DTYPES[dtype]) for shape, dtype in json.loads(spec)["outputs"]]


def _run_kernel(fn, inputs, attributes):
    out = fn(list(inputs), dict(attributes))
    return [out] if isinstance(out, torch.Tensor) else list(out)


@torch.library.impl("poptorch::custom_operation", "CompositeExplicitAutograd")
def _custom_operation_impl(inputs, name, domain, domain_version, spec):
    fn = _CUSTOM_KERNELS.get((domain, name))
    want = _spec_outputs(spec)
    if fn is None:      # PopTorch's CPU path: the example outputs stand in for the op
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in want]
    outs = _run_kernel(fn, [t.detach() for t in inputs], json.loads(spec)["attributes"])
    return [o.clone() for o in outs]


@torch.library.register_fake("poptorch::custom_operation")
def _custom_operation_fake(inputs, name, domain, domain_version, spec):
    return [inputs[0].new_empty(shape, dtype=dtype) if inputs else torch.empty(shape, dtype=dtype)
            for shape, dtype in _spec_outputs(spec)]


def _check_attribute(name, value):
    if isinstance(value, (list, tuple)):
        if not value:
            raise Error(f"custom_op attribute '{name}': an empty list is not supported")
        kinds = {type(v) for v in value}
        if len(kinds) != 1 or kinds.pop() not in (int, float, str):
            raise Error(f"custom_op attribute '{name}': lists must hold one type (float, int or str)")
        value = list(value)
    elif not isinstance(value, (int, float, str)):
        raise Error(f"custom_op attribute '{name}' has type {type(value).__name__}: use float, int, str or a list "
                    "of one of them")
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str) and not v.isascii():
            raise Error(f"custom_op attribute '{name}': strings must be ASCII")
    return value


def custom_op(inputs, name: str, domain: str, domain_version: int, example_outputs, attributes=None):
    """Run the custom op ``domain::name`` (PopTorch's ``custom_op``): ``inputs`` a tuple / list of
    tensors, ``example_outputs`` tensors giving the outputs' shapes and dtypes, ``attributes`` a
    dict of float / int / str or homogeneous lists of them (ASCII). Returns a list of tensors.

    openipu runs custom ops from Python: the kernel registered with :func:`register_custom_op`
    runs on the CPU, and on the simulated IPU as a generic vertex group (PopART's
    ``builder.customOp`` node), with its gradient from torch autograd in training. Without a
    registered kernel the CPU returns zeros shaped like ``example_outputs`` (placeholders) and
    compiling raises :class:`Error`."""
    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    if isinstance(example_outputs, torch.Tensor):
        example_outputs = [example_outputs]
    attrs = {str(k): _check_attribute(k, v) for k, v in (attributes or {}).items()}
    spec = json.dumps({"outputs": [[list(t.shape), str(t.dtype)] for t in example_outputs], "attributes": attrs})
    return list(torch.ops.poptorch.custom_operation(list(inputs), str(name), str(domain), int(domain_version), spec))


def register_custom_op(name: str, domain: str, kernel, domain_version: int = 1) -> None:
    """openipu's replacement for loading a custom op's C++ library
    (``torch.ops.load_library``): ``kernel(inputs: list[Tensor], attributes: dict) -> Tensor or
    list[Tensor]`` is the op ``domain::name``. It must be a function of its inputs and
    attributes only; its gradient (training) is torch autograd's vector-Jacobian product."""
    from openipu.popart.grads import grad_rule
    from openipu.popart.onnx_ops import onnx_op
    from openipu.popart.onnx_ops.grad import _vjp_kernel
    import functools
    _CUSTOM_KERNELS[(domain, name)] = kernel

    def popart_kernel(inputs, attrs, opset):
        return _run_kernel(kernel, inputs, {k: v for k, v in attrs.items() if not k.startswith("__")})
    onnx_op(name, domain=domain)(popart_kernel)
    grad_type = f"{name}Grad"
    onnx_op(grad_type, domain="ai.graphcore")(functools.partial(_vjp_kernel, (domain, name)))

    @grad_rule(name, domain=domain)
    def _grad(g, op):
        outs = [k for k, o in enumerate(op.outputs) if o and g.gy(k) is not None]
        grads = []
        for i in range(len(op.inputs)):
            if not g.needs(i) or not outs or g.dtype(g.x(i)) not in ("FLOAT", "FLOAT16"):
                grads.append(None)
                continue
            parts = [g.vjp(i, k, op_type=grad_type) for k in outs]
            grads.append(parts[0] if len(parts) == 1 else g.add("Sum", parts))
        return grads


# ----------------------------------------------------------------------------------------------
# host callbacks
# ----------------------------------------------------------------------------------------------
_CPU_DOMAIN = "poptorch.cpu"


class CPU:
    """``poptorch.CPU(layer_to_call, ID)``: ``layer_to_call`` runs on the host in the middle of
    the IPU program (a host callback; inference only, as in PopTorch). On the CPU it is a plain
    call. In openipu the callback is a custom op whose Python kernel is the layer: the IPU
    program streams its inputs to the host, runs the layer there and streams the outputs back
    (costed as a generic vertex group)."""

    def __init__(self, layer_to_call, ID: str):  # noqa: N803
        self.layer, self.ID = layer_to_call, str(ID)
        name = f"callback_{self.ID}"

        def kernel(inputs, attributes):
            with torch.no_grad():
                out = self.layer(*inputs)
            return [out] if isinstance(out, torch.Tensor) else list(out)
        register_custom_op(name, _CPU_DOMAIN, kernel)
        self._name = name

    def __call__(self, *inputs):
        if not isRunningOnIpu():
            return self.layer(*inputs)
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily(), torch.no_grad():     # the outputs' shapes, from zeros on the host
            ex = self.layer(*[torch.zeros(t.shape, dtype=t.dtype) for t in inputs])
        single = isinstance(ex, torch.Tensor)
        outs = custom_op(list(inputs), self._name, _CPU_DOMAIN, 1, [ex] if single else list(ex))
        return outs[0] if single else tuple(outs)


# ----------------------------------------------------------------------------------------------
# control flow
# ----------------------------------------------------------------------------------------------
def _tensors(xs, what):
    xs = list(xs)
    if not all(isinstance(t, torch.Tensor) for t in xs):
        raise Error(f"{what}: inputs must be a list of tensors")
    return xs


#: True while a training model is being captured (set by the executor)
_capturing_training = [False]


def for_loop(count: int, body, inputs):
    """Run ``body`` ``count`` times on the device (PopTorch's ``for_loop``): ``body(*tensors)``
    returns as many tensors as it takes, of the same shapes; ``inputs`` (a list of tensors) are
    passed by value. Returns the final tensors (a list). Raises ``ValueError`` (PopTorch's
    messages) when ``inputs`` is not a list of tensors.

    An inference model captures it as one PopART ``Loop``. The simulated PopART has no
    gradient of ``Loop``, so a training model captures the loop unrolled (``count`` copies of
    the body): the same values and gradients, the cost of the unrolled ops. A body that torch
    cannot capture as one loop (one that changes a buffer in place, ``self.buf.copy_(x)``) is
    captured unrolled too, with the same values."""
    if not isinstance(inputs, list):
        raise ValueError("poptorch.for_loop expects input tensors (inputs) to be a list of tensors. (Object is not "
                         "list)")
    for ind, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise ValueError("poptorch.for_loop expects input tensors (inputs) to be a list of tensors. (Object "
                             f"contained in list at index {ind} is not torch.tensor)")
    count = int(count)

    def step(*xs):
        out = body(*xs)
        out = [out] if isinstance(out, torch.Tensor) else list(out)
        if len(out) != len(xs):
            raise Error(f"poptorch.for_loop: the body returned {len(out)} tensors for {len(xs)} inputs: it must "
                        "return as many tensors as it takes")
        return out
    def unrolled():
        xs = [t.clone() for t in inputs]
        for _ in range(count):
            xs = step(*xs)
        return xs
    if not isRunningOnIpu() or _capturing_training[0]:
        return unrolled()
    from torch._higher_order_ops.while_loop import while_loop

    def cond_fn(i, *xs):
        return i < count

    def body_fn(i, *xs):
        return (i + 1, *[o.clone() for o in step(*xs)])
    try:
        out = while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int32), *[t.clone() for t in inputs]))
    except Error:
        raise
    except Exception as e:  # torch's loop capture refused the body (side effects): unroll it
        if "higher order operator" not in str(e) and "graph break" not in str(e):
            raise
        return unrolled()
    return list(out[1:])


def cond(condition, then_body, then_inps, else_body, else_inps):
    """``then_body(*then_inps)`` if ``condition`` (a one-element bool tensor) else
    ``else_body(*else_inps)``, decided on the device (PopTorch's ``cond``, inference only). Both
    branches must return the same number of tensors of the same shapes and types. Returns a
    list. Captured as one PopART ``If``."""
    then_inps, else_inps = _tensors(then_inps, "cond"), _tensors(else_inps, "cond")

    def as_list(out):
        return [out] if isinstance(out, torch.Tensor) else list(out)
    if not isRunningOnIpu():
        return as_list(then_body(*then_inps) if bool(condition) else else_body(*else_inps))
    n = len(then_inps)

    def t(*a):
        return tuple(o.clone() for o in as_list(then_body(*a[:n])))

    def e(*a):
        return tuple(o.clone() for o in as_list(else_body(*a[n:])))
    pred = condition.reshape(()) if condition.dtype == torch.bool else condition.reshape(()) != 0
    try:
        return list(torch.cond(pred, t, e, tuple(then_inps) + tuple(else_inps)))
    except Error:
        raise
    except Exception as ex:
        raise Error(f"poptorch.cond: the branches could not be captured: {str(ex).strip().splitlines()[0]} (both "
                    "branches must return the same number of tensors, of the same shapes and types)") from ex


# ----------------------------------------------------------------------------------------------
# scopes: names, attributes, multi-convolutions (recorded on the ops captured inside)
# ----------------------------------------------------------------------------------------------
SCOPE_KEY, ATTRS_KEY, MULTICONV_KEY = "poptorch_name_scope", "poptorch_attributes", "poptorch_multiconv"
_scopes: list = []
_attributes: list = []


class _Annotating:
    """A context that annotates the ops captured inside (no effect on the CPU)."""

    def _annotation(self) -> dict:
        raise NotImplementedError

    def __enter__(self):
        from openipu.poptorch import blocks
        self._ctx = None
        self._push()
        if blocks._state.active:
            import torch.fx.traceback as fxt
            self._ctx = fxt.annotate(self._annotation())
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        self._pop()
        return False

    def _push(self):
        pass

    def _pop(self):
        pass


class NameScope(_Annotating):
    """``with poptorch.NameScope("layer1"):`` the ops inside get names prefixed ``layer1/``
    (nested scopes join with ``/``; PopART's ``builder.nameScope``)."""

    def __init__(self, name: str):
        self.name = str(name)

    def _push(self):
        _scopes.append(self.name)

    def _pop(self):
        _scopes.pop()

    def _annotation(self):
        return {SCOPE_KEY: "/".join(_scopes)}


class Attribute(_Annotating):
    """``with poptorch.Attribute(__outline={"layer": 3}):`` every op inside carries the attribute
    ``__outline`` (PopART node attribute; a dict value of str / int / float is stored as its JSON
    text, sorted by key). Nested attributes add up; an inner one wins for the same name."""

    def __init__(self, **attributes):
        for k, v in attributes.items():
            if not isinstance(v, dict) or not all(isinstance(x, (str, int, float)) for x in v.values()):
                raise Error(f"Attribute '{k}' must be a dict of str, int or float values, e.g. "
                            "Attribute(__outline={'layer': 0})")
        self.attributes = {k: json.dumps(v, sort_keys=True) for k, v in attributes.items()}

    def _push(self):
        _attributes.append(self.attributes)

    def _pop(self):
        _attributes.pop()

    def _annotation(self):
        merged = {}
        for a in _attributes:
            merged.update(a)
        return {ATTRS_KEY: json.dumps(merged, sort_keys=True)}


class MultiConv(_Annotating):
    """``with poptorch.MultiConv():`` the convolutions inside are planned together (PopTorch's
    ``MultiConv``; PopART's ``multiconv``, which the simulated PopART splits into its
    convolutions). openipu lowers them as plain convolutions carrying the options: the k-th
    convolution takes ``availableMemoryProportions[k]`` and ``partialsTypes[k]`` (one value
    applies to all); ``planType``, ``perConvReservedTiles``, ``cycleBackOff`` and
    ``enableConvDithering`` are recorded as ``__multiconv_*`` node attributes."""

    _count = 0

    def __init__(self):
        self._amp = None
        self._partials = None
        self._dithering = None
        self._plan = None
        self._reserved = None
        self._backoff = None

    @staticmethod
    def _per_conv(value, what, check):
        vals = list(value) if isinstance(value, (list, tuple)) else [value]
        for v in vals:
            check(v)
        return vals

    def availableMemoryProportions(self, value):  # noqa: N802
        def check(v):
            if not 0.0 < float(v) <= 1.0:
                raise Error(f"MultiConv.availableMemoryProportions: {v} must be in (0, 1]")
        self._amp = [float(v) for v in self._per_conv(value, "availableMemoryProportions", check)]
        return self

    def partialsTypes(self, value):  # noqa: N802
        names = {torch.float: "FLOAT", torch.float32: "FLOAT", torch.half: "HALF", torch.float16: "HALF",
                 "float": "FLOAT", "half": "HALF"}

        def check(v):
            if v not in names:
                raise Error(f"MultiConv.partialsTypes: {v} must be torch.float or torch.half")
        self._partials = [names[v] for v in self._per_conv(value, "partialsTypes", check)]
        return self

    def enableConvDithering(self, value):  # noqa: N802
        self._dithering = [int(bool(v)) for v in self._per_conv(value, "enableConvDithering", lambda v: None)]
        return self

    def planType(self, value):  # noqa: N802
        from openipu.poptorch.enums import MultiConvPlanType
        self._plan = MultiConvPlanType(value).name.lower()
        return self

    def perConvReservedTiles(self, value: int):  # noqa: N802
        self._reserved = int(value)
        return self

    def cycleBackOff(self, value: float):  # noqa: N802
        if not 0.0 <= float(value) <= 1.0:
            raise Error("MultiConv.cycleBackOff must be in [0, 1]")
        self._backoff = float(value)
        return self

    _depth = 0

    def _push(self):
        from openipu.poptorch import blocks
        if blocks._state.active and MultiConv._depth:
            raise Error("Nested poptorch.MultiConv is not supported.", type="poptorch_cpp_error")
        MultiConv._count += 1
        MultiConv._depth += 1
        self._id = MultiConv._count

    def _pop(self):
        MultiConv._depth = max(MultiConv._depth - 1, 0)

    def _annotation(self):
        return {MULTICONV_KEY: json.dumps({"id": self._id, "amp": self._amp, "partials": self._partials,
                                           "dithering": self._dithering, "plan": self._plan,
                                           "reserved": self._reserved, "backoff": self._backoff})}


# ----------------------------------------------------------------------------------------------
# overlapped host I/O
# ----------------------------------------------------------------------------------------------
#: the overlap modes set while the model being captured ran (checked by the executor)
_overlaps: list = []


def _set_overlap(tensors, mode, what: str):
    from openipu.poptorch import _utils
    from openipu.poptorch.enums import OverlapMode
    mode = OverlapMode(mode)
    flat = _utils.flattenTensorStructure(tensors)
    if isinstance(tensors, torch.Tensor):
        flat = [tensors]
    for t in _leaves(tensors):
        if not isinstance(t, torch.Tensor):
            raise Error(f"You may only set overlap for torch.tensor {what}. {type(t)} is not supported.")
    if isRunningOnIpu() and mode != OverlapMode.NoOverlap:
        _overlaps.append((what, mode))
    return _utils.reconstructTensorStructure(tensors, iter(flat))


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def set_overlap_for_input(input_tensors, mode):
    """Overlap the host-to-IPU copies of ``input_tensors`` (a tensor, or a tuple / list / dict
    of them) with computation (PopTorch's ``set_overlap_for_input``, ``mode`` an
    ``OverlapMode``); returns the tensors, to be used in their place. PopTorch requires IO tiles
    (``Options.TensorLocations.numIOTiles``), a non-pipelined strategy and output mode All or
    Sum (:class:`Error` otherwise, at compile time). Raises :class:`Error` for a non-tensor.

    openipu accepts it with those checks and computes the same values; its cost model streams
    host data at the start of each step and does not overlap it with compute, so predicted
    times are those of ``OverlapMode.NoOverlap``."""
    return _set_overlap(input_tensors, mode, "inputs")


def set_overlap_for_output(output_tensors, mode):
    """Overlap the IPU-to-host copies of ``output_tensors`` with computation (PopTorch's
    ``set_overlap_for_output``); as :func:`set_overlap_for_input`."""
    return _set_overlap(output_tensors, mode, "outputs")
