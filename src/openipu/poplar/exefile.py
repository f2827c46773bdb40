"""A safe, versioned file format for executables: a zip of JSON records and ``.npy`` arrays, no pickle.

Poplar, PopART's engine cache, PopTorch's ``compileAndExport`` and PopRT's exported executables all
write an object graph (the Poplar graph, its programs and options, plus what each front end adds)
with :func:`save` and read it with :func:`load`. The layout is documented in
``docs/executable-format.md``:

- ``manifest.json``: ``format`` (``"openipu-executable"``), ``version`` (:data:`VERSION`), ``kind``
  (what the file holds, e.g. ``"poplar.Executable"``, ``"poprt.Executable"``), ``meta`` (free
  JSON for the front end), and ``members``: the SHA-256 and size in bytes of every other member;
- ``objects.json``: the object graph as a table of records (see :class:`_Encoder`);
- ``arrays.bin``: the numpy / torch arrays: all arrays of one dtype flattened into one array, one
  ``np.save`` stream per dtype, read back with ``np.load(allow_pickle=False)``;
  ``arrays.index.json`` says where each dtype's stream is and each array's offset and shape.

Loading never runs code from the file: objects are rebuilt only from classes and functions on an
allow-list (see :func:`_resolve`): anything defined in the ``openipu`` package; a few pure functions
of ``torch``, ``numpy``, ``math`` and ``operator``; and, for user codelets, ``Vertex`` subclasses of
modules that the loading process has already imported (a module is never imported on the file's
say). Anything else, a tampered member (hash mismatch), a truncated or corrupt zip, another format
or version raises :class:`executable_file_error` (a ``poplar_error``) with the reason.

Host cost scales with the number of objects (the graph's structure), not with element counts: the
arrays are written and read as whole buffers.
"""

from __future__ import annotations

import copyreg
import enum
import functools
import hashlib
import importlib
import io
import json
import os
import sys
import types
import zipfile
from contextlib import contextmanager

import numpy as np
import torch

from openipu.poplar.errors import poplar_error

FORMAT = "openipu-executable"
#: Format version this build writes and reads. Bump when the record layout changes.
VERSION = 1

_MEMBERS = ("objects.json", "arrays.bin")


class executable_file_error(poplar_error):  # noqa: N801 - Poplar's naming of errors
    """An executable file that cannot be read: not this format, another version, corrupt,
    truncated, tampered with, or naming a class or function outside the allow-list."""


# ----------------------------------------------------------------------------------------------
# allow-list
# ----------------------------------------------------------------------------------------------
#: Library modules whose pure functions may be named by a file (kernels use them directly).
_LIB_MODULES = {"torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft", "numpy", "math",
                "operator", "builtins", "collections", "functools"}
#: Names never resolved from those modules (file or process access, code evaluation).
_DENY = {"load", "save", "from_file", "fromfile", "loadtxt", "genfromtxt", "memmap", "savez", "savetxt", "tofile",
         "open", "eval", "exec", "compile", "__import__", "input", "breakpoint", "globals", "locals", "vars",
         "setattr", "delattr", "hub", "system", "frombuffer", "_reconstruct", "_load_from_bytes", "getattr"}
#: Builtins a file may name (types and pure functions).
_BUILTINS = {"list", "tuple", "dict", "set", "frozenset", "int", "float", "complex", "bool", "str", "bytes",
             "bytearray", "slice", "range", "object", "abs", "min", "max", "sum", "len", "round", "pow", "divmod",
             "any", "all", "sorted", "reversed", "zip", "map", "filter", "enumerate", "NotImplemented", "Ellipsis"}


#: openipu names a file may never name: they read files or load code (``addCodelets`` imports a
#: ``.py`` file), or drive the command line.
_DENY_OPENIPU = {"_collect_codelets", "addCodelets", "load", "save", "loadExecutable", "deserialize", "serialize",
                 "compileAndExport", "compile_and_export", "main", "resolve_model", "run_model", "import_module"}
_DENY_OPENIPU_MODULES = ("openipu.cli", "openipu.runner", "openipu.poplar.exefile")
#: Functions a record may call while loading (besides allow-listed classes): reduce helpers.
_CONSTRUCTORS = {("openipu.poplar.types", "type_from_name")}


def _is_openipu(module: str) -> bool:
    return module == "openipu" or module.startswith("openipu.")


def _lookup(obj, qualname: str):
    """``qualname`` inside module ``obj``, never passing through another module (a file may not
    reach ``os`` as ``openipu.x.os``)."""
    for part in qualname.split("."):
        if part == "<locals>" or part.startswith("<"):
            raise executable_file_error(f"'{qualname}' is a local object; only module-level names can be loaded")
        obj = getattr(obj, part)
        if isinstance(obj, types.ModuleType):
            raise executable_file_error(f"'{qualname}' names a module; only classes and functions can be loaded")
    return obj


def _resolve(module: str, qualname: str):
    """The class or function ``module.qualname`` if it is on the allow-list, else
    :class:`executable_file_error`. Never imports a module outside openipu and the libraries above."""
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise executable_file_error("A record names a class or function with a non-string name")
    if _is_openipu(module):
        if module.startswith(_DENY_OPENIPU_MODULES) or set(qualname.split(".")) & _DENY_OPENIPU:
            raise executable_file_error(f"The executable names '{module}.{qualname}', which an executable may not use")
        try:
            mod = importlib.import_module(module)
            obj = _lookup(mod, qualname)
        except (ImportError, AttributeError) as e:
            raise executable_file_error(f"The executable names '{module}.{qualname}', which this openipu does not "
                                        f"have ({e}). Was it written by another openipu version?") from None
        # a name re-exported by an openipu module must itself be defined in openipu
        home = getattr(obj, "__module__", None)
        if not (isinstance(home, str) and _is_openipu(home)) and not isinstance(obj, enum.Enum):
            raise executable_file_error(f"The executable names '{module}.{qualname}', which is defined in "
                                        f"'{home}', not in openipu: not on the allow-list")
        return obj
    if module in _LIB_MODULES:
        leaf = qualname.split(".")[-1]
        if leaf in _DENY or qualname.split(".")[0] in _DENY or (module == "builtins" and qualname not in _BUILTINS):
            raise executable_file_error(f"The executable names '{module}.{qualname}', which is not on the allow-list "
                                        "of classes and functions an executable may use")
        try:
            return _lookup(importlib.import_module(module), qualname)
        except AttributeError:
            raise executable_file_error(f"The executable names '{module}.{qualname}', which does not exist") from None
    # user codelets: Vertex subclasses of modules the process has already imported
    mod = sys.modules.get(module)
    if mod is not None:
        try:
            obj = _lookup(mod, qualname)
        except AttributeError:
            obj = None
        from openipu.poplar.vertex import Vertex
        if isinstance(obj, type) and issubclass(obj, Vertex):
            return obj
    raise executable_file_error(
        f"The executable names '{module}.{qualname}', which is not on the allow-list (openipu classes and functions, "
        "and Vertex codelet classes of modules already imported). Import the module of your codelets before "
        "loading the executable")


# ----------------------------------------------------------------------------------------------
# encoding
# ----------------------------------------------------------------------------------------------
_TORCH_VIEW = {torch.bfloat16: torch.int16}
for _n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _n):
        _TORCH_VIEW[getattr(torch, _n)] = torch.uint8


def _name_of(obj) -> tuple[str, str]:
    module = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if module is None and isinstance(obj, types.BuiltinFunctionType):
        module = "builtins"
    if not module or not qual or "<locals>" in qual or "<lambda>" in qual:
        raise executable_file_error(f"Cannot save {obj!r}: only module-level classes and functions can be "
                                    "saved (define codelets and kernels at module level)")
    # numpy ufuncs and torch builtins report their public module poorly: check the name resolves
    try:
        if _lookup(importlib.import_module(module), qual) is not obj:
            raise AttributeError
    except Exception:  # noqa: BLE001 - any failure means "cannot be named"
        name = getattr(obj, "__name__", None)
        for alt in ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft", "numpy", "math",
                    "operator", "builtins"):
            for q in dict.fromkeys((qual, name)):
                try:
                    if q and _lookup(importlib.import_module(alt), q) is obj:
                        return alt, q
                except Exception:  # noqa: BLE001
                    pass
        raise executable_file_error(f"Cannot save {obj!r}: '{module}.{qual}' does not name it") from None
    return module, qual


class _Encoder:
    """Object graph -> a table of JSON records and a list of arrays.

    A value is JSON itself (``None``, ``bool``, ``int``, ``float``, ``str``) or ``{"r": i}``, a
    reference to record ``i``. Records (``t`` is the kind): ``list``/``tuple``/``set``/``frozenset``
    (``v``: values), ``dict`` (``k``, ``v``), ``nd`` (``a``: array index), ``tt`` (torch tensor:
    ``a``, ``dtype``, ``view``), ``nps`` (numpy scalar: ``dtype``, ``a``), ``dtype`` (``v``),
    ``tdtype`` (``v``), ``bytes`` (``a``), ``name`` (class or function: ``m``, ``q``),
    ``partial`` (``f``, ``a``, ``k``, ``s``), ``method`` (``self``, ``name``), ``enum`` (``c``,
    ``v``), ``obj`` (``f``: the constructor (a ``name``), ``a``: its arguments, then ``s``
    state, ``li`` list items, ``di`` dict items, as in ``__reduce_ex__``).
    Each object is written once; later uses refer to its record, so sharing and cycles survive.
    """

    def __init__(self):
        self.records: list = []
        self.arrays: list[np.ndarray] = []
        self.memo: dict[int, int] = {}
        self.keep: list = []      # keep encoded objects alive: ids must not be reused

    def _new(self, obj, rec) -> int:
        i = len(self.records)
        self.records.append(rec)
        if obj is not None:
            self.memo[id(obj)] = i
            self.keep.append(obj)
        return i

    def _array(self, a: np.ndarray) -> int:
        self.arrays.append(np.ascontiguousarray(a))
        return len(self.arrays) - 1

    def enc(self, obj):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if type(obj) is int:
            return obj
        if type(obj) is float:
            if obj != obj or obj in (float("inf"), float("-inf")):
                return {"r": self._new(None, {"t": "float", "v": repr(obj)})}
            return obj
        i = self.memo.get(id(obj))
        if i is not None:
            return {"r": i}
        return {"r": self._record(obj)}

    def _record(self, obj) -> int:
        t = type(obj)
        if t in (list, set, frozenset, dict) or t is tuple:
            kind = {list: "list", set: "set", frozenset: "frozenset", dict: "dict", tuple: "tuple"}[t]
            rec = {"t": kind}
            i = self._new(obj, rec)
            if t is dict:
                rec["k"] = [self.enc(k) for k in obj.keys()]
                rec["v"] = [self.enc(v) for v in obj.values()]
            else:
                rec["v"] = [self.enc(v) for v in obj]
            return i
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                return self._new(obj, {"t": "ndobj", "shape": list(obj.shape),
                                       "v": self.enc(obj.reshape(-1).tolist())})
            return self._new(obj, {"t": "nd", "a": self._array(obj)})
        if isinstance(obj, np.generic):
            return self._new(obj, {"t": "nps", "a": self._array(np.asarray(obj))})
        if isinstance(obj, np.dtype):
            if obj.fields or obj.hasobject:
                raise executable_file_error(f"Cannot save the numpy dtype {obj}: structured dtypes are not supported")
            return self._new(obj, {"t": "dtype", "v": obj.str})
        if isinstance(obj, torch.Tensor):
            x = obj.detach().cpu().contiguous()
            rec = {"t": "tt", "dtype": str(x.dtype).removeprefix("torch."), "grad": bool(obj.requires_grad)}
            if x.dtype in _TORCH_VIEW:
                x = x.view(_TORCH_VIEW[x.dtype])
                rec["view"] = True
            rec["a"] = self._array(x.numpy())
            return self._new(obj, rec)
        if isinstance(obj, torch.dtype):
            return self._new(obj, {"t": "tdtype", "v": str(obj).removeprefix("torch.")})
        if isinstance(obj, torch.device):
            return self._new(obj, {"t": "tdevice", "v": str(obj)})
        if t in (bytes, bytearray):
            return self._new(obj, {"t": t.__name__, "a": self._array(np.frombuffer(bytes(obj), np.uint8))})
        if t is int:
            return self._new(obj, {"t": "bigint", "v": str(obj)})
        if t is complex:
            return self._new(obj, {"t": "complex", "v": [obj.real, obj.imag]})
        if t is slice:
            rec = {"t": "slice"}
            i = self._new(obj, rec)
            rec["v"] = [self.enc(obj.start), self.enc(obj.stop), self.enc(obj.step)]
            return i
        if t is range:
            return self._new(obj, {"t": "range", "v": [obj.start, obj.stop, obj.step]})
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, np.ufunc)) or obj is NotImplemented:
            if obj is NotImplemented:
                m, q = "builtins", "NotImplemented"
            else:
                m, q = _name_of(obj)
            return self._new(obj, {"t": "name", "m": m, "q": q})
        if isinstance(obj, functools.partial):
            rec = {"t": "partial"}
            i = self._new(obj, rec)
            rec["f"], rec["a"], rec["k"] = self.enc(obj.func), self.enc(list(obj.args)), self.enc(dict(obj.keywords))
            return i
        if isinstance(obj, types.MethodType):
            if obj.__name__.startswith("__"):
                raise executable_file_error(f"Cannot save the bound method {obj!r}")
            rec = {"t": "method", "name": obj.__name__}
            i = self._new(obj, rec)
            rec["self"] = self.enc(obj.__self__)
            return i
        if isinstance(obj, enum.Enum):
            return self._new(obj, {"t": "enum", "c": self.enc(t), "v": obj.name})
        return self._reduce(obj)

    def _reduce(self, obj) -> int:
        t = type(obj)
        m = getattr(t, "__module__", "")
        if not (_is_openipu(m) or m in ("collections",)):
            from openipu.poplar.vertex import Vertex
            if not (isinstance(obj, Vertex)):
                raise executable_file_error(
                    f"Cannot save an object of type {m}.{t.__qualname__}: executables hold openipu objects, arrays "
                    "and module-level functions only")
        try:
            rv = obj.__reduce_ex__(4)
        except Exception as e:  # noqa: BLE001
            raise executable_file_error(f"Cannot save {t.__qualname__}: {e}") from None
        if isinstance(rv, str):           # a module-level singleton
            return self._new(obj, {"t": "name", "m": m, "q": rv})
        fn, args = rv[0], rv[1]
        state = rv[2] if len(rv) > 2 else None
        li = rv[3] if len(rv) > 3 else None
        di = rv[4] if len(rv) > 4 else None
        if fn is copyreg.__newobj__:
            cls, args = args[0], args[1:]
            rec = {"t": "obj", "new": self.enc(cls), "a": self.enc(list(args))}
        elif getattr(fn, "__name__", "") == "__newobj_ex__":
            cls, args, kw = args
            rec = {"t": "obj", "new": self.enc(cls), "a": self.enc(list(args)), "kw": self.enc(dict(kw))}
        else:
            rec = {"t": "obj", "f": self.enc(fn), "a": self.enc(list(args))}
        i = self._new(obj, rec)
        if state is not None:
            rec["s"] = self.enc(state)
        if li is not None:
            rec["li"] = self.enc(list(li))
        if di is not None:
            rec["di"] = self.enc(list(di))
        return i


# ----------------------------------------------------------------------------------------------
# decoding
# ----------------------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, records: list, arrays):
        self.records = records
        self.arrays = arrays          # callable: index -> np.ndarray
        self.memo: dict[int, object] = {}

    def dec(self, v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, dict) and len(v) == 1 and "r" in v:
            i = v["r"]
            if not isinstance(i, int) or not 0 <= i < len(self.records):
                raise executable_file_error(f"A record refers to record {i!r}, which does not exist")
            if i in self.memo:
                return self.memo[i]
            return self._build(i)
        raise executable_file_error(f"Malformed value in the object records: {str(v)[:80]}")

    def _name(self, v):
        rec = self.records[v["r"]] if isinstance(v, dict) and isinstance(v.get("r"), int) and \
            0 <= v["r"] < len(self.records) else None
        if rec is None or rec.get("t") not in ("name",):
            raise executable_file_error("A constructor record does not name a class or function")
        return self.dec(v)

    def _build(self, i: int):
        rec = self.records[i]
        if not isinstance(rec, dict) or "t" not in rec:
            raise executable_file_error(f"Record {i} is malformed")
        t = rec["t"]
        memo = self.memo
        if t == "list":
            out = memo[i] = []
            out.extend(self.dec(x) for x in rec["v"])
        elif t == "dict":
            out = memo[i] = {}
            for k, x in zip(rec["k"], rec["v"], strict=True):
                out[self.dec(k)] = self.dec(x)
        elif t == "set":
            out = memo[i] = set()
            out.update(self.dec(x) for x in rec["v"])
        elif t == "tuple":
            out = memo[i] = tuple(self.dec(x) for x in rec["v"])
        elif t == "frozenset":
            out = memo[i] = frozenset(self.dec(x) for x in rec["v"])
        elif t == "float":
            out = memo[i] = float(rec["v"])
        elif t == "bigint":
            out = memo[i] = int(rec["v"])
        elif t == "complex":
            out = memo[i] = complex(*rec["v"])
        elif t == "slice":
            out = memo[i] = slice(*(self.dec(x) for x in rec["v"]))
        elif t == "range":
            out = memo[i] = range(*(int(x) for x in rec["v"]))
        elif t == "nd":
            out = memo[i] = self.arrays(rec["a"])
        elif t == "ndobj":
            out = np.empty(int(np.prod(rec["shape"])), dtype=object)
            memo[i] = out
            out[:] = self.dec(rec["v"])
            out = memo[i] = out.reshape(rec["shape"])
        elif t == "nps":
            out = memo[i] = self.arrays(rec["a"])[()]
        elif t == "dtype":
            out = memo[i] = np.dtype(str(rec["v"]))
            if out.hasobject:
                raise executable_file_error("Object dtypes cannot be loaded")
        elif t == "tdtype":
            out = memo[i] = _torch_dtype(rec["v"])
        elif t == "tdevice":
            out = memo[i] = torch.device(str(rec["v"]))
        elif t == "tt":
            a = self.arrays(rec["a"])
            x = torch.from_numpy(a.copy() if not a.flags.writeable else a)
            dt = _torch_dtype(rec["dtype"])
            x = x.view(dt) if rec.get("view") else x.to(dt)
            if rec.get("grad"):
                x.requires_grad_(True)
            out = memo[i] = x
        elif t in ("bytes", "bytearray"):
            b = self.arrays(rec["a"]).tobytes()
            out = memo[i] = b if t == "bytes" else bytearray(b)
        elif t == "name":
            out = memo[i] = _resolve(rec["m"], rec["q"])
        elif t == "enum":
            cls = self._name(rec["c"])
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
                raise executable_file_error(f"Record {i}: {cls!r} is not an enum")
            out = memo[i] = cls[rec["v"]]
        elif t == "partial":
            f = self.dec(rec["f"])
            if not callable(f):
                raise executable_file_error(f"Record {i}: a partial of a non-callable")
            out = memo[i] = functools.partial(f, *self.dec(rec["a"]), **self.dec(rec["k"]))
        elif t == "method":
            self_ = self.dec(rec["self"])
            name = rec["name"]
            if not isinstance(name, str) or name.startswith("__") or name in _DENY_OPENIPU or name in _DENY:
                raise executable_file_error(f"Record {i}: method name {name!r} is not allowed")
            out = memo[i] = getattr(self_, name)
        elif t == "obj":
            out = self._obj(i, rec)
        else:
            raise executable_file_error(f"Record {i} has the unknown kind '{t}'")
        return out

    def _obj(self, i, rec):
        if "new" in rec:
            cls = self._name(rec["new"])
            if not isinstance(cls, type):
                raise executable_file_error(f"Record {i}: {cls!r} is not a class")
            args = self.dec(rec["a"])
            kw = self.dec(rec["kw"]) if "kw" in rec else {}
            obj = cls.__new__(cls, *args, **kw)
        else:
            fn = self._name(rec["f"])
            f_rec = self.records[rec["f"]["r"]]
            if (f_rec.get("m"), f_rec.get("q")) not in _CONSTRUCTORS and not (
                    isinstance(fn, type) and f_rec.get("m") in ("collections", "builtins")):
                raise executable_file_error(f"Record {i}: '{f_rec.get('m')}.{f_rec.get('q')}' may not be called "
                                            "while loading (only classes and registered constructors may)")
            obj = fn(*self.dec(rec["a"]))
        self.memo[i] = obj
        if "s" in rec:
            state = self.dec(rec["s"])
            setstate = getattr(obj, "__setstate__", None)
            if setstate is not None and type(obj).__setstate__ is not object.__dict__.get("__setstate__"):
                setstate(state)
            else:
                slots = None
                if isinstance(state, tuple) and len(state) == 2:
                    state, slots = state
                if state:
                    obj.__dict__.update(state)
                if slots:
                    for k, v in slots.items():
                        object.__setattr__(obj, k, v)
        for x in self.dec(rec["li"]) if "li" in rec else ():
            obj.append(x)
        for k, v in self.dec(rec["di"]) if "di" in rec else ():
            obj[k] = v
        return obj


def _torch_dtype(name):
    dt = getattr(torch, str(name), None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise executable_file_error(f"Unknown torch dtype '{name}' in the executable")
    return dt


@contextmanager
def _deep():
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 100_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


# ----------------------------------------------------------------------------------------------
# the file
# ----------------------------------------------------------------------------------------------
def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def dumps(obj, kind: str, meta: dict | None = None) -> bytes:
    """The file's bytes for ``obj`` (see :func:`save`)."""
    buf = io.BytesIO()
    save(buf, obj, kind, meta)
    return buf.getvalue()


def save(f, obj, kind: str, meta: dict | None = None) -> None:
    """Write ``obj`` to ``f`` (a path or a binary file object) as an executable file.

    Args:
        obj: the object graph: openipu objects, containers, numpy arrays, torch tensors, module-
            level functions and classes, ``functools.partial``.
        kind: what the file holds (checked by :func:`load`), e.g. ``"poplar.Executable"``.
        meta: JSON-serialisable facts for the front end, stored in the manifest.
    Raises:
        executable_file_error: an object that cannot be saved safely (a lambda, a local function,
            an object of a class outside openipu).
    """
    enc = _Encoder()
    with _deep():
        root = enc.enc(obj)
    objects = json.dumps({"root": root, "records": enc.records}, separators=(",", ":")).encode()
    # one flat array per dtype (one .npy header to parse per dtype, not per array)
    by_dtype: dict[str, list] = {}
    filled: dict[str, int] = {}             # elements so far per dtype (a running offset)
    entries = []
    for a in enc.arrays:
        parts = by_dtype.setdefault(a.dtype.str, [])
        off = filled.get(a.dtype.str, 0)
        entries.append([a.dtype.str, off, list(a.shape)])
        parts.append(a.reshape(-1))
        filled[a.dtype.str] = off + a.size
    arrays = io.BytesIO()
    groups = {}
    for dt, parts in by_dtype.items():
        start = arrays.tell()
        np.save(arrays, np.concatenate(parts) if parts else np.zeros(0, dt), allow_pickle=False)
        groups[dt] = [start, arrays.tell() - start]
    arrays_b = arrays.getvalue()
    index = json.dumps({"groups": groups, "arrays": entries}).encode()
    members = {"objects.json": objects, "arrays.index.json": index, "arrays.bin": arrays_b}
    manifest = {"format": FORMAT, "version": VERSION, "kind": kind,
                "writer": _writer(), "meta": meta or {},
                "members": {k: {"sha256": _sha(v), "size": len(v)} for k, v in members.items()}}
    out = f if hasattr(f, "write") else open(os.fspath(f), "wb")
    try:
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1), compress_type=zipfile.ZIP_DEFLATED)
            z.writestr("objects.json", objects, compress_type=zipfile.ZIP_DEFLATED)
            z.writestr("arrays.index.json", index, compress_type=zipfile.ZIP_DEFLATED)
            z.writestr("arrays.bin", arrays_b, compress_type=zipfile.ZIP_STORED)
    finally:
        if out is not f:
            out.close()


def _writer() -> str:
    try:
        from openipu import __version__
    except ImportError:  # pragma: no cover
        __version__ = "?"
    return f"openipu {__version__}"


def read_manifest(f) -> dict:
    """The manifest of an executable file (format, version, kind, meta, members), checked for
    format and version but without reading the members."""
    with _open(f) as z:
        return _manifest(z, f)


@contextmanager
def _open(f):
    name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<stream>")
    try:
        if isinstance(f, (str, os.PathLike)):
            if not os.path.isfile(f):
                raise executable_file_error(f"No executable file at '{os.fspath(f)}'")
            z = zipfile.ZipFile(os.fspath(f))
        else:
            data = f.read()
            z = zipfile.ZipFile(io.BytesIO(data))
    except executable_file_error:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise executable_file_error(f"'{name}' is not an openipu executable file, or it is truncated or corrupt "
                                    f"({type(e).__name__}: {e})") from None
    try:
        yield z
    finally:
        z.close()


def _member(z, name, fname) -> bytes:
    try:
        return z.read(name)
    except KeyError:
        raise executable_file_error(f"'{fname}' has no member '{name}': it is not a complete openipu executable "
                                    "file") from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, Exception) as e:  # zlib.error and CRC errors
        raise executable_file_error(f"'{fname}': member '{name}' is corrupt ({type(e).__name__}: {e})") from None


def _manifest(z, f) -> dict:
    fname = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<stream>"
    try:
        man = json.loads(_member(z, "manifest.json", fname))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise executable_file_error(f"'{fname}': the manifest is not valid JSON ({e})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise executable_file_error(f"'{fname}' is not an openipu executable file (format "
                                    f"{man.get('format') if isinstance(man, dict) else None!r}, expected '{FORMAT}')")
    if man.get("version") != VERSION:
        raise executable_file_error(f"'{fname}' is an openipu executable of format version {man.get('version')!r}; "
                                    f"this openipu reads version {VERSION}. Compile the model again")
    if not isinstance(man.get("members"), dict):
        raise executable_file_error(f"'{fname}': the manifest lists no members")
    return man


def load(f, kind: str | tuple | None = None):
    """Read an executable file written by :func:`save`; returns ``(obj, manifest)``.

    Args:
        f: a path or a binary file object.
        kind: the expected ``kind`` (or a tuple of accepted kinds); ``None`` accepts any.
    Raises:
        executable_file_error: missing file, not a zip, truncated, another format or version,
            another kind, a member whose SHA-256 differs from the manifest, malformed records, or a
            class or function outside the allow-list.
    """
    fname = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<stream>"
    with _open(f) as z:
        man = _manifest(z, f)
        kinds = (kind,) if isinstance(kind, str) else kind
        if kinds is not None and man.get("kind") not in kinds:
            raise executable_file_error(f"'{fname}' holds a '{man.get('kind')}', not a {' or '.join(kinds)}")
        data = {}
        for name, info in man["members"].items():
            b = _member(z, name, fname)
            if not isinstance(info, dict) or _sha(b) != info.get("sha256") or len(b) != info.get("size"):
                raise executable_file_error(f"'{fname}': member '{name}' does not match its SHA-256 in the manifest "
                                            "(the file was modified or damaged)")
            data[name] = b
    for name in ("objects.json", "arrays.index.json", "arrays.bin"):
        if name not in data:
            raise executable_file_error(f"'{fname}': the manifest does not list '{name}'")
    try:
        objs = json.loads(data["objects.json"])
        index = json.loads(data["arrays.index.json"])
        root, records = objs["root"], objs["records"]
        groups, entries = index["groups"], index["arrays"]
        if not isinstance(records, list) or not isinstance(entries, list) or not isinstance(groups, dict):
            raise TypeError("records, arrays and groups have the wrong types")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise executable_file_error(f"'{fname}': the object records are malformed ({e})") from None
    blob = memoryview(data["arrays.bin"])

    flat: dict[str, np.ndarray] = {}

    def array(k):
        try:
            dt, off, shape = entries[k]
            if dt not in flat:
                start, n = groups[dt]
                if not (0 <= start and start + n <= len(blob)):
                    raise ValueError("array group outside arrays.bin")
                g = np.load(io.BytesIO(blob[start:start + n]), allow_pickle=False)
                if g.ndim != 1 or g.dtype.str != dt:
                    raise ValueError(f"array group {dt} is not a flat {dt} array")
                flat[dt] = g
            size = int(np.prod(shape, dtype=np.int64))
            if not (isinstance(off, int) and 0 <= off and off + size <= flat[dt].size):
                raise ValueError("array outside its group")
            return flat[dt][off:off + size].reshape(shape)
        except (IndexError, KeyError, TypeError, ValueError, OSError) as e:
            raise executable_file_error(f"'{fname}': array {k!r} cannot be read ({e})") from None

    dec = _Decoder(records, array)
    try:
        with _deep():
            obj = dec.dec(root)
    except executable_file_error:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        raise executable_file_error(f"'{fname}': the object records are malformed ({type(e).__name__}: {e})") from None
    return obj, man
