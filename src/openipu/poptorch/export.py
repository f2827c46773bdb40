"""PopTorch's executable files (``PoplarExecutor.save`` / ``compileAndExport``,
``loadExecutable``, ``poptorch.load``) in a safe format: loading a file never runs code from it.

PopTorch appends a pickled ``PoptorchData`` (the model, options, optimizer) to the Poplar
executable; unpickling can run arbitrary code. openipu's file is its executable container
(:mod:`openipu.poplar.exefile`: size-bounded, hash-checked members) holding data only:

- ``poptorch.json``: ``{"format": "openipu.poptorch.executable", "version": 1, ...}`` — the
  PopTorch version, training flag, options (enums as ``{"__enum__": class, "name": ...}``, torch
  dtypes as ``{"__dtype__": "torch.float32"}``), the input signature (names, shapes, dtypes; the
  non-tensor arguments, which must be JSON values), the PopART ids of the inputs / outputs /
  loss, the outputs' pytree structure (``torch.utils._pytree.treespec_dumps``, JSON), the weights
  (PopART id -> module path), IPUs and pipelining, the RNG state and the optimizer (class name,
  parameter groups by weight path, hyper-parameters);
- ``model.onnx``: the lowered PopART (ONNX) model;
- ``w<i>.npy``: the weights at save time (``.npy`` headers checked before allocation);
- ``executable.popef``: PopART's executable record (the session's fingerprint; PopART compiles
  the model again when it loads one, or takes the program this process compiled).

Loading uses ``executable.popef`` when it was compiled from the same model, options and target
(PopART's fingerprint check), and compiles the ONNX model again otherwise (options edited by
``edit_opts_fn``, an executable of another openipu version, a file without one). A file written by
:func:`write` is read by :func:`read` and :func:`read_executable`; any other content raises
:class:`Error`.
"""

from __future__ import annotations

import enum
import inspect
import io
import json
import os
import zipfile

import numpy as np
import torch
import torch.utils._pytree as pytree

from openipu.poptorch import enums as penums
from openipu.poptorch.errors import Error

FORMAT, VERSION = "openipu.poptorch.executable", 2
_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.int32, torch.int64, torch.bool, torch.int8,
                               torch.uint8, torch.int16, torch.float64, torch.bfloat16)}


# -- JSON encoding of option values -----------------------------------------------------------
def encode(v):
    """``v`` as JSON data (enums, torch dtypes, tuples handled). Raises :class:`Error` for a value
    that has no JSON form."""
    if isinstance(v, enum.Enum):
        return {"__enum__": type(v).__name__, "name": v.name}
    if isinstance(v, torch.dtype):
        return {"__dtype__": str(v)}
    if isinstance(v, dict):
        return {str(k): encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    raise Error(f"Cannot save a value of type {type(v).__name__} ({v!r}) in an executable file: only JSON values, "
                "enums and torch dtypes are stored")


#: The enums a file may name: PopTorch's own (a closed table, not a lookup in a module).
_ENUMS = {n: c for n, c in vars(penums).items()
          if isinstance(c, type) and issubclass(c, enum.Enum) and c.__module__ == penums.__name__}


def decode(v):
    if isinstance(v, dict):
        if "__enum__" in v:
            cls = _ENUMS.get(v["__enum__"]) if isinstance(v["__enum__"], str) else None
            if cls is None or not isinstance(v.get("name"), str) or v["name"] not in cls.__members__:
                raise Error(f"Unknown enum {str(v['__enum__'])[:40]}.{str(v.get('name'))[:40]} in the executable file")
            return cls[v["name"]]
        if "__dtype__" in v:
            if v["__dtype__"] not in _DTYPES:
                raise Error(f"Unknown dtype {str(v['__dtype__'])[:40]} in the executable file")
            return _DTYPES[v["__dtype__"]]
        return {k: decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [decode(x) for x in v]
    return v


def options_to_json(o) -> dict:
    return {"values": encode(o._values), "Precision": encode(o.Precision._values),
            "Training": encode(o.Training._values), "Jit": encode(o.Jit._values),
            "_Popart": {"options": encode(o._Popart.options), "patterns": encode(o._Popart.patterns),
                        "pattern_level": o._Popart.pattern_level}}


def options_from_json(d: dict):
    from openipu.poptorch.enums import ConnectionType
    from openipu.poptorch.options import Options
    o = Options()
    for target, key in ((o, "values"), (o.Precision, "Precision"), (o.Training, "Training"), (o.Jit, "Jit")):
        vals = decode(d[key])
        for k, v in vals.items():
            if k in target._values:
                target._values[k] = tuple(v) if isinstance(target._values[k], tuple) else v
    o._values["anchored_tensors"] = {k: tuple(v) for k, v in o._values["anchored_tensors"].items()}
    o._Popart.options = decode(d["_Popart"]["options"])
    o._Popart.patterns = decode(d["_Popart"]["patterns"])
    o._Popart.pattern_level = int(d["_Popart"]["pattern_level"])
    # as PopTorch's poptorch.load: the offline-target settings of a model compiled with
    # useOfflineIpuTarget are dropped, so the loaded model runs on an attached IPU
    o._values["offline_ipu_version"] = None
    if ConnectionType(o._values["connection_type"]) == ConnectionType.Never:
        o._values["connection_type"] = ConnectionType.Always
    return o


# -- optimizer ------------------------------------------------------------------------------------
def optimizer_to_json(opt, param_paths: dict) -> dict | None:
    """``param_paths``: parameter -> module path."""
    if opt is None:
        return None
    from openipu.poptorch import optim as poptorch_optim
    groups = []
    for g in opt.param_groups:
        try:
            paths = [param_paths[p] for p in g["params"]]
        except KeyError:
            raise Error("Cannot save the optimizer: it holds parameters that are not the model's") from None
        groups.append({"params": paths, **{k: encode(v) for k, v in g.items() if k != "params"}})
    module = "poptorch" if isinstance(opt, poptorch_optim.Optimizer) else "torch"
    extra = {k: encode(getattr(opt, k)) for k in getattr(opt, "_EXTRA", {})}
    return {"class": type(opt).__name__, "module": module, "groups": groups, "extra": extra,
            "variable_attrs": sorted(getattr(opt, "variable_attrs", []))}


def optimizer_from_json(d: dict | None, model: torch.nn.Module):
    if d is None:
        return None
    from openipu.poptorch import optim as poptorch_optim
    ns = poptorch_optim if d["module"] == "poptorch" else torch.optim
    cls = getattr(ns, d["class"], None)
    if not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
        raise Error(f"Unknown optimizer {d['module']}.optim.{d['class']} in the executable file")
    groups = [{**{k: decode(v) for k, v in g.items() if k != "params"},
               "params": [model.get_parameter(p) for p in g["params"]]} for g in d["groups"]]
    for g in groups:
        for k, v in g.items():
            if isinstance(v, list) and k != "params":
                g[k] = tuple(v)
    opt = cls(groups)
    for k, v in d["extra"].items():
        setattr(opt, k, decode(v))
    if hasattr(opt, "variable_attrs"):
        opt.variable_attrs = set(d["variable_attrs"])
    return opt


# -- the model of a loaded file ---------------------------------------------------------------
class LoadedModel(torch.nn.Module):
    """The module :func:`poptorch.load` gives back: the saved weights as parameters / buffers at
    their module paths (``fc1.weight`` ...), and a ``forward`` with the saved model's signature
    but no code (the file stores none), so it runs on the (simulated) IPU only."""

    def __init__(self, signature: list | None = None):
        super().__init__()
        params = [inspect.Parameter(name, getattr(inspect.Parameter, kind),
                                    default=decode(default) if has else inspect.Parameter.empty)
                  for name, kind, has, default in (signature or [])]

        def forward(*args, **kwargs):
            raise Error("This model was loaded from an executable file, which stores no Python code: it can only "
                        "run through the PopTorch wrapper poptorch.load returned")
        if signature is not None:
            forward.__signature__ = inspect.Signature(params)
            self.forward = forward

    def forward(self, *args, **kwargs):
        raise Error("This model was loaded from an executable file, which stores no Python code: it can only run "
                    "through the PopTorch wrapper poptorch.load returned")


def _set(model: torch.nn.Module, path: str, value: torch.Tensor, param: bool) -> None:
    *mods, name = path.split(".")
    m = model
    for part in mods:
        if not hasattr(m, part):
            m.add_module(part, torch.nn.Module())
        m = getattr(m, part)
    if param:
        m.register_parameter(name, torch.nn.Parameter(value))
    else:
        m.register_buffer(name, value)


# -- files --------------------------------------------------------------------------------------
EXE_KIND = "poptorch.Executable"


def write(filename: str, meta: dict, model_bytes: bytes, weights: dict, executable: bytes | None = None) -> str:
    """Write the file (openipu's executable container, kind ``poptorch.Executable``); returns the
    path written (``model.poptorch`` inside a directory). Raises :class:`Error` for metadata with
    no JSON form."""
    from openipu.poplar import exefile
    dst_dir = os.path.dirname(filename)
    if dst_dir:
        os.makedirs(dst_dir, exist_ok=True)
    if os.path.isdir(filename):
        filename = os.path.join(filename, "model.poptorch")
    meta = {"format": FORMAT, "version": VERSION, **meta, "weight_ids": list(weights)}
    members = {"poptorch.json": meta, "model.onnx": model_bytes}
    for i, a in enumerate(weights.values()):
        members[f"w{i}.npy"] = np.asarray(a)
    if executable is not None:
        members["executable.popef"] = executable
    try:
        exefile.write(filename, EXE_KIND, members)
    except exefile.executable_file_error as e:
        raise Error(f"Cannot save the executable: {e}") from None
    return filename


def _contents(filename):
    from openipu.poplar import exefile
    try:
        return exefile.read(filename, EXE_KIND)
    except exefile.executable_file_error as e:
        raise Error(f"Invalid file {filename}: not an openipu PopTorch executable of this version ({e})") from None


def read_executable(filename: str) -> bytes | None:
    """The compiled PopART executable stored in ``filename`` (bytes in openipu's executable
    format), or None when the file has none. Raises :class:`Error` for a bad file."""
    c = _contents(filename)
    return bytes(c.bytes("executable.popef")) if c.has("executable.popef") else None


def read(filename: str) -> tuple[dict, bytes, dict]:
    """(metadata, ONNX model bytes, weights PopART id -> array). Raises :class:`Error` for a file
    that is not an openipu PopTorch executable of this format version, or is malformed."""
    from openipu.poplar import exefile
    c = _contents(filename)
    try:
        meta = c.json("poptorch.json")
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise Error(f"Invalid file {filename}: not an openipu PopTorch executable of format version {VERSION}")
        ids = meta.get("weight_ids")
        if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
            raise Error(f"Invalid file {filename}: malformed weight ids")
        arrays = [c.array(f"w{i}.npy") for i in range(len(ids))]
        model_bytes = bytes(c.bytes("model.onnx"))
    except exefile.executable_file_error as e:
        raise Error(f"Invalid file {filename}: {e}") from None
    return meta, model_bytes, dict(zip(ids, arrays))


def spec_dumps(spec) -> str:
    return pytree.treespec_dumps(spec)


def spec_loads(s: str):
    return pytree.treespec_loads(s)
