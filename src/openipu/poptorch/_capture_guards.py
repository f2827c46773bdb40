"""What a ``PoplarExecutor`` compile does around the capture of the model: the plain tensor
attributes captured as buffers, PopTorch's errors for buffers and parameters reassigned or
removed by ``forward``, and the host-side change of a mutated attribute."""

from __future__ import annotations

import contextlib

import torch

from openipu.poptorch.errors import Error


def _tensor_attributes(model: torch.nn.Module) -> dict:
    """``{path: clone}`` of the plain tensor attributes (neither parameters nor buffers) of
    ``model``'s modules: the values a captured graph takes as constants."""
    out = {}
    for prefix, m in model.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and not k.startswith("_"):
                out[f"{prefix}.{k}" if prefix else k] = v.detach().clone()
    return out


#: modules whose buffers may be replaced while the model runs (PopTorch's ``BUFFERS_CAN_CHANGE``)
_BUFFERS_CAN_CHANGE = (torch.nn.modules.batchnorm._BatchNorm,)


@contextlib.contextmanager
def _no_reassignment(model: torch.nn.Module, plain: set = frozenset()):
    """While ``model`` is captured, assigning a new tensor to one of its buffers or parameters
    (``self.buf = self.buf + 1``) raises PopTorch's :class:`Error` ("Buffer buf is reassigned
    within the model when calling the forward method. This is not supported. Consider using
    self.buf.copy_(src) ..."); deleting one raises "... is removed from the model ...". BatchNorm
    modules may replace their buffers (PopTorch's exception), and so may the plain tensor
    attributes ``plain`` (paths) captured as buffers."""
    owners = {id(m): prefix for prefix, m in model.named_modules() if not isinstance(m, _BUFFERS_CAN_CHANGE)}
    param_owners = {id(m): prefix for prefix, m in model.named_modules()}
    orig_set, orig_del = torch.nn.Module.__setattr__, torch.nn.Module.__delattr__

    def check(mod, name, removed):
        kind = "Buffer" if name in mod._buffers and id(mod) in owners else \
            "Parameter" if name in mod._parameters and id(mod) in param_owners else None
        if kind is None:
            return
        prefix = param_owners[id(mod)]
        full = f"{prefix}.{name}" if prefix else name
        if full in plain:
            return
        if removed:
            raise Error(f"{kind} {full} is removed from the model when calling the forward method.")
        raise Error(f"{kind} {full} is reassigned within the model when calling the forward method. This is not "
                    f"supported. Consider using self.{full}.copy_(src) to copy data from a source tensor, where src "
                    "is the name of the source tensor.")

    def guarded_set(mod, name, value):
        if isinstance(value, torch.Tensor) or value is None:
            cur = mod.__dict__.get("_buffers", {}).get(name, mod.__dict__.get("_parameters", {}).get(name))
            if cur is not None and value is not cur:
                check(mod, name, False)
        return orig_set(mod, name, value)

    def guarded_del(mod, name):
        check(mod, name, True)
        return orig_del(mod, name)
    torch.nn.Module.__setattr__, torch.nn.Module.__delattr__ = guarded_set, guarded_del
    try:
        yield
    finally:
        torch.nn.Module.__setattr__, torch.nn.Module.__delattr__ = orig_set, orig_del


@contextlib.contextmanager
def _attributes_as_buffers(model: torch.nn.Module, attrs: dict):
    """The plain tensor attributes ``attrs`` (paths) of ``model`` registered as non-persistent
    buffers while the model is captured, so that changing one in place is captured (torch.export
    refuses to capture a changed constant). :func:`capture.build` then lowers them as the
    constants PopTorch makes of them (their values before the call)."""
    done = []
    try:
        for path in attrs:
            mod_path, _, name = path.rpartition(".")
            mod = model.get_submodule(mod_path) if mod_path else model
            t = vars(mod)[name]
            delattr(mod, name)
            mod.register_buffer(name, t, persistent=False)
            done.append((mod, name, t))
        yield
    finally:
        for mod, name, t in done:
            mod._buffers.pop(name, None)
            mod._non_persistent_buffers_set.discard(name)
            object.__setattr__(mod, name, t)


def _trace_attribute_mutations(model: torch.nn.Module, ep, attrs: dict, args, kwargs) -> None:
    """PopTorch traces the model on the host, so a plain tensor attribute (not a buffer) changed in
    place by ``forward`` (``self.i += 1``) is changed once on the host by the trace, while the
    graph keeps its value before the call as a constant (PopTorch's ``docs/user_guide/buffers.py``:
    two runs both return ``tensor([1.])`` and ``model.i`` is then ``tensor([1.])``). The captured
    program is run once on the micro-batch inputs when it mutates such an attribute, and the
    attribute takes the value it left (the host tensor is updated in place)."""
    mutated = [p for p in ep.graph_signature.buffers_to_mutate.values() if p in attrs]
    if not mutated:
        return
    gm = ep.module()
    with torch.no_grad():
        gm(*args, **kwargs)
    for path in mutated:
        mod_path, _, name = path.rpartition(".")
        mod = model.get_submodule(mod_path) if mod_path else model
        host = vars(mod).get(name)
        if isinstance(host, torch.Tensor):
            with torch.no_grad():
                host.copy_(gm.get_buffer(path))
