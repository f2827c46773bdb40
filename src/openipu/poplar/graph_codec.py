"""Poplar graphs and programs as typed records: the closed codec of ``poplar.Executable`` files.

A Poplar executable file (:mod:`openipu.poplar.exefile`, kind ``"poplar.Executable"``) holds the
graph (variables, tile mappings, compute sets, vertices, streams) and the programs, which are
compiled again when the file is loaded. They are written as a table of records in
``records.json`` and arrays in ``.npy`` members, and read back by a decoder that knows a fixed set
of record kinds:

- JSON values, containers (``list``, ``tuple``, ``set``, ``frozenset``, ``dict``), non-finite and
  big numbers, ``slice``, ``range``;
- arrays (``nd``: numpy, ``tt``: torch, ``nps``: a numpy scalar, ``bytes``) and dtypes (``dtype``,
  ``tdtype``, ``ptype``: a ``poplar.Type`` by name);
- ``obj``: an instance of a class registered with :func:`data_class` (the graph's own classes,
  programs, and the parameter classes of PopLibs' vertices), rebuilt without calling any of its
  code: ``cls.__new__`` and the declared fields only, each field checked against its declared
  type where one is declared;
- ``enum``: a member of an enum registered with :func:`data_enum`;
- ``kernel``: a vertex group's functional kernel, a function registered with :func:`kernel` (as a
  Poplar executable names its vertices' codelets by vertex type), with its bound arguments;
- ``codelet``: a user codelet, named by its vertex type and taken from the codelets this process
  has loaded (``Graph.addCodelets`` / ``addVertex``), as Poplar's codelets must be in the library.

Registration is done by openipu's own modules when they are imported; a file only names keys of
those registries. Nothing in a file names a module to import, an attribute to look up or a
function to call while loading; an unknown key, a field a class does not declare, a value of the
wrong type or a reference out of range raises :class:`executable_file_error`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import typing

import numpy as np
import torch

from openipu.poplar.deferred import DeferredValue
from openipu.poplar.exefile import executable_file_error

_CLASSES: dict[str, tuple[type, tuple, dict, typing.Callable | None]] = {}
_CLASS_KEY: dict[type, str] = {}
_ENUMS: dict[str, type] = {}
_KERNELS: dict[str, typing.Callable] = {}
_KERNEL_KEY: dict[typing.Callable, str] = {}
#: User codelets this process has loaded (vertex type name -> ``poplar.Vertex`` subclass).
LOADED_CODELETS: dict[str, type] = {}
#: Perf estimators this process has registered (vertex type name -> function).
LOADED_ESTIMATORS: dict[str, typing.Callable] = {}

_TORCH_VIEW = {torch.bfloat16: torch.int16}
for _n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _n):
        _TORCH_VIEW[getattr(torch, _n)] = torch.uint8
_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.float64, torch.bfloat16, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.bool, torch.complex64, torch.complex128, *(_TORCH_VIEW.keys()))}
for _n in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _n):
        _TORCH_DTYPES[_n] = getattr(torch, _n)


def _key(obj) -> str:
    return f"{obj.__module__.removeprefix('openipu.')}:{obj.__qualname__}"


_SIMPLE = {"int": int, "str": str, "bool": bool, "float": (int, float), "tuple": tuple, "list": list, "dict": dict,
           "np.ndarray": np.ndarray, "torch.Tensor": torch.Tensor}


def _field_types(cls) -> dict:
    """Declared field -> accepted Python types, from a dataclass's simple annotations
    (``int``, ``str``, ``X | None`` ...); fields with other annotations are not type-checked."""
    out = {}
    if not dataclasses.is_dataclass(cls):
        return out
    for f in dataclasses.fields(cls):
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        parts = [p.strip() for p in ann.split("|")]
        types_ = []
        for p in parts:
            if p == "None":
                types_.append(type(None))
            elif p in _SIMPLE:
                t = _SIMPLE[p]
                types_.extend(t if isinstance(t, tuple) else (t,))
            else:
                types_ = None
                break
        if types_:
            out[f.name] = tuple(types_)
    return out


def data_class(cls=None, *, fields: tuple | None = None, types: dict | None = None, after_decode=None,
               key: str | None = None):
    """Register ``cls`` as a record kind of Poplar executable files (a class decorator).

    Args:
        fields: the attributes a record holds (default: a dataclass's fields, else ``__slots__``).
        types: field -> accepted type(s), checked when a file is read (dataclass fields with simple
            annotations are checked without being listed).
        after_decode: ``after_decode(obj)``, openipu code run on the rebuilt object (e.g. to take
            what the loading process supplies, such as perf estimators).
        key: the name of the kind in files (default ``module:qualname``): a class moved to another
            module keeps the name files already hold.
    """
    def reg(c):
        if fields is not None:
            names = tuple(fields)
        elif dataclasses.is_dataclass(c):
            names = tuple(f.name for f in dataclasses.fields(c))
        elif "__slots__" in vars(c):
            names = tuple(c.__slots__)
        else:
            raise TypeError(f"data_class({c.__qualname__}) needs its fields")
        t = _field_types(c)
        t.update(types or {})
        name = key or _key(c)
        _CLASSES[name] = (c, names, t, after_decode)
        _CLASS_KEY[c] = name
        return c
    return reg(cls) if cls is not None else reg


def data_enum(cls, key: str | None = None):
    """Register an ``enum.Enum`` subclass whose members files may hold (a class decorator).
    ``key`` names it in files (default ``module:qualname``): an enum moved to another module
    keeps the name files already hold."""
    key = key or _key(cls)
    _ENUMS[key] = cls
    _CLASS_KEY[cls] = key
    return cls


def kernel(fn):
    """Register ``fn`` as a vertex kernel (or a helper a kernel takes as an argument) that a
    Poplar executable file may name, with its bound arguments (a function decorator)."""
    k = _key(fn)
    _KERNELS[k] = fn
    _KERNEL_KEY[fn] = k
    return fn


def kernel_registered(fn) -> bool:
    return fn in _KERNEL_KEY


# ----------------------------------------------------------------------------------------------
# encoding
# ----------------------------------------------------------------------------------------------
class Encoder:
    """Object graph -> ``records`` (JSON) and ``arrays`` (numpy). Shared objects and cycles are
    written once and referred to as ``{"r": i}``."""

    def __init__(self):
        self.records: list = []
        self.arrays: list[np.ndarray] = []
        self.memo: dict[int, int] = {}
        self.keep: list = []

    def _new(self, obj, rec) -> int:
        i = len(self.records)
        self.records.append(rec)
        if obj is not None:
            self.memo[id(obj)] = i
            self.keep.append(obj)
        return i

    def _array(self, a: np.ndarray) -> int:
        if a.dtype.hasobject or a.dtype.fields is not None:
            raise executable_file_error(f"Cannot save an array of dtype {a.dtype}")
        self.arrays.append(a if a.flags.c_contiguous else a.copy(order="C"))   # 0-d arrays stay 0-d
        return len(self.arrays) - 1

    def enc(self, obj):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        t = type(obj)
        if t is DeferredValue:          # a constant's value not made yet: saved as the value
            obj = obj.resolve()
            t = type(obj)
        if t is int:
            return obj if -(1 << 62) < obj < (1 << 62) else {"r": self._new(None, {"t": "bigint", "v": str(obj)})}
        if t is float:
            if math.isfinite(obj):
                return obj
            return {"r": self._new(None, {"t": "float", "v": repr(obj)})}
        i = self.memo.get(id(obj))
        if i is not None:
            return {"r": i}
        return {"r": self._record(obj)}

    def _record(self, obj) -> int:  # noqa: C901 - one branch per record kind
        t = type(obj)
        if t in (list, tuple, set, frozenset, dict):
            rec = {"t": t.__name__}
            i = self._new(obj, rec)
            if t is dict:
                rec["k"] = [self.enc(k) for k in obj.keys()]
                rec["v"] = [self.enc(v) for v in obj.values()]
            else:
                rec["v"] = [self.enc(v) for v in obj]
            return i
        if isinstance(obj, np.ndarray):
            return self._new(obj, {"t": "nd", "a": self._array(obj)})
        if isinstance(obj, np.generic):
            return self._new(obj, {"t": "nps", "a": self._array(np.asarray(obj))})
        if isinstance(obj, np.dtype):
            if obj.hasobject or obj.fields is not None:
                raise executable_file_error(f"Cannot save the numpy dtype {obj}")
            return self._new(obj, {"t": "dtype", "v": obj.str})
        if isinstance(obj, torch.Tensor):
            x = obj.detach().cpu().contiguous()
            if str(x.dtype).removeprefix("torch.") not in _TORCH_DTYPES:
                raise executable_file_error(f"Cannot save a torch tensor of dtype {x.dtype}")
            rec = {"t": "tt", "dtype": str(x.dtype).removeprefix("torch."), "grad": bool(obj.requires_grad)}
            if x.dtype in _TORCH_VIEW:
                x = x.view(_TORCH_VIEW[x.dtype])
            rec["a"] = self._array(x.numpy())
            return self._new(obj, rec)
        if isinstance(obj, torch.dtype):
            name = str(obj).removeprefix("torch.")
            if name not in _TORCH_DTYPES:
                raise executable_file_error(f"Cannot save the torch dtype {obj}")
            return self._new(obj, {"t": "tdtype", "v": name})
        if t in (bytes, bytearray):
            return self._new(obj, {"t": t.__name__, "a": self._array(np.frombuffer(bytes(obj), np.uint8))})
        if t is slice:
            rec = {"t": "slice"}
            i = self._new(obj, rec)
            rec["v"] = [self.enc(obj.start), self.enc(obj.stop), self.enc(obj.step)]
            return i
        if t is range:
            return self._new(obj, {"t": "range", "v": [obj.start, obj.stop, obj.step]})
        if isinstance(obj, enum.Enum):
            key = _CLASS_KEY.get(t)
            if key not in _ENUMS:
                raise executable_file_error(f"Cannot save {obj!r}: enum {t.__qualname__} is not a registered record "
                                            "kind")
            return self._new(obj, {"t": "enum", "c": key, "v": obj.name})
        from openipu.poplar.types import Type
        if t is Type:
            return self._new(obj, {"t": "ptype", "v": obj.space})     # QUARTER has one per fp8 format
        if isinstance(obj, functools.partial):
            key = _KERNEL_KEY.get(obj.func)
            if key is None:
                raise executable_file_error(f"Cannot save the kernel {_describe(obj.func)}: it is not a registered "
                                            "vertex kernel")
            rec = {"t": "kernel", "f": key}
            i = self._new(obj, rec)
            rec["a"] = [self.enc(a) for a in obj.args]
            rec["k"] = {str(k): self.enc(v) for k, v in obj.keywords.items()}
            return i
        if callable(obj) and not isinstance(obj, type) and obj in _KERNEL_KEY:
            return self._new(obj, {"t": "kernel", "f": _KERNEL_KEY[obj], "a": [], "k": {}})
        if isinstance(obj, type):
            from openipu.poplar.vertex import Vertex
            if issubclass(obj, Vertex):
                name = obj.vertex_name
                if LOADED_CODELETS.get(name) is not obj:
                    LOADED_CODELETS[name] = obj
                return self._new(obj, {"t": "codelet", "v": name})
            raise executable_file_error(f"Cannot save the class {obj.__qualname__}: executables hold data, not classes")
        key = _CLASS_KEY.get(t)
        if key is None or key not in _CLASSES:
            raise executable_file_error(f"Cannot save {_describe(obj)}: {t.__module__}.{t.__qualname__} is not a "
                                        "record kind of Poplar executables (a vertex kernel's arguments must be "
                                        "tensors, numbers, strings, arrays and openipu's registered classes)")
        _, names, _, _ = _CLASSES[key]
        rec = {"t": "obj", "c": key}
        i = self._new(obj, rec)
        fields = {}
        for n in names:
            try:
                v = object.__getattribute__(obj, n)
            except AttributeError:
                continue
            fields[n] = self.enc(v)
        rec["f"] = fields
        return i


def _describe(obj) -> str:
    return f"{type(obj).__qualname__} {getattr(obj, '__qualname__', '')}".strip()


# ----------------------------------------------------------------------------------------------
# decoding
# ----------------------------------------------------------------------------------------------
class Decoder:
    """Records and arrays -> objects, by the record kinds of the module docstring only."""

    def __init__(self, records: list, array: typing.Callable[[int], np.ndarray], what: str):
        if not isinstance(records, list):
            raise executable_file_error(f"{what}: the records are not a list")
        self.records, self.array, self.what = records, array, what
        self.memo: dict[int, object] = {}
        self.building: set[int] = set()
        self.after: list = []

    def bad(self, msg) -> executable_file_error:
        return executable_file_error(f"{self.what}: {msg}")

    def dec(self, v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if type(v) is int or type(v) is float:
            return v
        if isinstance(v, dict) and len(v) == 1 and "r" in v:
            i = v["r"]
            if type(i) is not int or not 0 <= i < len(self.records):
                raise self.bad(f"a reference to record {i!r}, which does not exist")
            if i in self.memo:
                return self.memo[i]
            if i in self.building:
                raise self.bad(f"record {i} refers to itself through an immutable value")
            self.building.add(i)
            try:
                return self._build(i)
            finally:
                self.building.discard(i)
        raise self.bad(f"a malformed value {str(v)[:60]}")

    def finish(self, root):
        for obj, hook in self.after:
            hook(obj)
        return root

    def _list(self, rec, key="v") -> list:
        v = rec.get(key)
        if not isinstance(v, list):
            raise self.bad(f"a '{rec.get('t')}' record without its values")
        return v

    def _build(self, i: int):  # noqa: C901 - one branch per record kind
        rec = self.records[i]
        if not isinstance(rec, dict) or not isinstance(rec.get("t"), str):
            raise self.bad(f"record {i} is malformed")
        t = rec["t"]
        memo = self.memo
        if t == "list":
            out = memo[i] = []
            out.extend(self.dec(x) for x in self._list(rec))
        elif t == "dict":
            out = memo[i] = {}
            ks, vs = self._list(rec, "k"), self._list(rec, "v")
            if len(ks) != len(vs):
                raise self.bad(f"record {i}: a dict with {len(ks)} keys and {len(vs)} values")
            for k, x in zip(ks, vs):
                k = self.dec(k)
                try:
                    out[k] = self.dec(x)
                except TypeError:
                    raise self.bad(f"record {i}: an unhashable dict key") from None
        elif t in ("set", "frozenset"):
            items = [self.dec(x) for x in self._list(rec)]
            try:
                out = memo[i] = set(items) if t == "set" else frozenset(items)
            except TypeError:
                raise self.bad(f"record {i}: an unhashable set item") from None
        elif t == "tuple":
            out = memo[i] = tuple(self.dec(x) for x in self._list(rec))
        elif t == "float":
            if rec.get("v") not in ("nan", "inf", "-inf"):
                raise self.bad(f"record {i}: a non-finite float must be nan, inf or -inf")
            out = memo[i] = float(rec["v"])
        elif t == "bigint":
            v = rec.get("v")
            if not isinstance(v, str) or not 0 < len(v) <= 64 or not v.lstrip("-").isdigit():
                raise self.bad(f"record {i}: a malformed integer")
            out = memo[i] = int(v)
        elif t == "slice":
            v = [self.dec(x) for x in self._list(rec)]
            if len(v) != 3 or not all(x is None or type(x) is int for x in v):
                raise self.bad(f"record {i}: a malformed slice")
            out = memo[i] = slice(*v)
        elif t == "range":
            v = self._list(rec)
            if len(v) != 3 or not all(type(x) is int for x in v) or v[2] == 0:
                raise self.bad(f"record {i}: a malformed range")
            out = memo[i] = range(*v)
        elif t == "nd":
            out = memo[i] = self.array(rec.get("a"))
        elif t == "nps":
            a = self.array(rec.get("a"))
            if a.ndim != 0:
                raise self.bad(f"record {i}: a numpy scalar that is not 0-dimensional")
            out = memo[i] = a[()]
        elif t == "dtype":
            try:
                out = np.dtype(str(rec.get("v")))
            except TypeError:
                raise self.bad(f"record {i}: unknown numpy dtype {str(rec.get('v'))[:40]!r}") from None
            if out.hasobject or out.fields is not None:
                raise self.bad(f"record {i}: numpy dtype {out} is not a plain dtype")
            memo[i] = out
        elif t == "tdtype":
            out = memo[i] = self._tdtype(rec.get("v"), i)
        elif t == "tt":
            a = self.array(rec.get("a"))
            dt = self._tdtype(rec.get("dtype"), i)
            x = torch.from_numpy(np.array(a))
            if dt in _TORCH_VIEW:
                if x.dtype != _TORCH_VIEW[dt]:
                    raise self.bad(f"record {i}: a {dt} tensor stored as {x.dtype}")
                x = x.view(dt)
            elif x.dtype != dt:
                raise self.bad(f"record {i}: a {dt} tensor stored as {x.dtype}")
            if rec.get("grad") is True and dt.is_floating_point:
                x.requires_grad_(True)
            out = memo[i] = x
        elif t in ("bytes", "bytearray"):
            a = self.array(rec.get("a"))
            if a.dtype != np.uint8 or a.ndim != 1:
                raise self.bad(f"record {i}: bytes stored as {a.dtype}")
            out = memo[i] = bytes(a) if t == "bytes" else bytearray(a)
        elif t == "ptype":
            from openipu.poplar.types import type_from_name
            try:
                out = memo[i] = type_from_name(str(rec.get("v")))
            except Exception:  # noqa: BLE001 - an unknown name
                raise self.bad(f"record {i}: unknown poplar type {str(rec.get('v'))[:40]!r}") from None
        elif t == "enum":
            cls = _ENUMS.get(rec.get("c"))
            if cls is None:
                raise self.bad(f"record {i}: unknown enum {str(rec.get('c'))[:80]!r}")
            try:
                out = memo[i] = cls[rec.get("v")]
            except (KeyError, TypeError):
                raise self.bad(f"record {i}: {cls.__qualname__} has no member {str(rec.get('v'))[:40]!r}") from None
        elif t == "kernel":
            fn = _KERNELS.get(rec.get("f"))
            if fn is None:
                raise self.bad(f"record {i}: unknown vertex kernel {str(rec.get('f'))[:80]!r} (written by another "
                               "openipu version?)")
            args = [self.dec(x) for x in self._list(rec, "a")]
            kw = rec.get("k", {})
            if not isinstance(kw, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kw):
                raise self.bad(f"record {i}: malformed kernel keywords")
            kwargs = {k: self.dec(x) for k, x in kw.items()}
            out = memo[i] = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        elif t == "codelet":
            name = rec.get("v")
            out = LOADED_CODELETS.get(name) if isinstance(name, str) else None
            if out is None:
                raise self.bad(f"the executable uses the codelet '{str(name)[:80]}', which this process has not "
                               "loaded: add it with graph.addCodelets() before deserializing")
            memo[i] = out
        elif t == "obj":
            out = self._obj(i, rec)
        else:
            raise self.bad(f"record {i} has the unknown kind {t[:40]!r}")
        return out

    def _tdtype(self, name, i):
        dt = _TORCH_DTYPES.get(name) if isinstance(name, str) else None
        if dt is None:
            raise self.bad(f"record {i}: unknown torch dtype {str(name)[:40]!r}")
        return dt

    def _obj(self, i: int, rec: dict):
        entry = _CLASSES.get(rec.get("c"))
        if entry is None:
            raise self.bad(f"record {i}: unknown record kind {str(rec.get('c'))[:80]!r} (written by another openipu "
                           "version?)")
        cls, names, types_, after = entry
        fields = rec.get("f")
        if not isinstance(fields, dict):
            raise self.bad(f"record {i}: a {cls.__qualname__} record without fields")
        extra = set(fields) - set(names)
        if extra:
            raise self.bad(f"record {i}: {cls.__qualname__} has no field {sorted(extra)[0][:40]!r}")
        obj = cls.__new__(cls)
        self.memo[i] = obj
        slots = "__dict__" not in dir(cls) or "__slots__" in vars(cls)
        for n, x in fields.items():
            v = self.dec(x)
            want = types_.get(n)
            if want is not None and not isinstance(v, want):
                raise self.bad(f"record {i}: {cls.__qualname__}.{n} is a {type(v).__name__}, not a "
                               f"{' or '.join(w.__name__ for w in (want if isinstance(want, tuple) else (want,)))}")
            if slots:
                object.__setattr__(obj, n, v)
            else:
                obj.__dict__[n] = v
        if after is not None:
            self.after.append((obj, after))
        return obj


def encode(obj) -> tuple[dict, list[np.ndarray]]:
    """``obj`` -> (the JSON of ``records.json``, the arrays). Raises :class:`executable_file_error`
    for an object no record kind holds (a lambda or local function as a kernel, a class that is
    not registered)."""
    enc = Encoder()
    root = enc.enc(obj)
    return {"root": root, "records": enc.records}, enc.arrays


def decode(doc, array: typing.Callable[[int], np.ndarray], what: str):
    """The object of ``records.json``'s ``doc``; ``array(k)`` returns array ``k``. Raises
    :class:`executable_file_error` for anything the module docstring does not allow."""
    if not isinstance(doc, dict) or "root" not in doc:
        raise executable_file_error(f"{what}: the records have no root")
    d = Decoder(doc.get("records"), array, what)
    try:
        return d.finish(d.dec(doc["root"]))
    except executable_file_error:
        raise
    except RecursionError:
        raise executable_file_error(f"{what}: the records nest too deeply") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as e:
        raise executable_file_error(f"{what}: malformed records ({type(e).__name__}: {e})") from None


def to_members(obj) -> dict:
    """``obj`` as executable-file members: ``records.json``, ``arrays.json`` (the index) and one
    ``arrays-<k>.npy`` per dtype (all arrays of a dtype flattened into one, so a graph of
    thousands of small arrays has a handful of ``.npy`` headers to check)."""
    doc, arrays = encode(obj)
    groups: dict[str, list] = {}
    filled: dict[str, int] = {}          # elements so far per dtype (a running offset)
    number: dict[str, int] = {}
    entries = []
    for a in arrays:
        dt = a.dtype.str
        parts = groups.setdefault(dt, [])
        g = number.setdefault(dt, len(number))
        off = filled.get(dt, 0)
        entries.append([g, off, list(a.shape)])
        parts.append(a.reshape(-1))
        filled[dt] = off + a.size
    members = {"records.json": doc, "arrays.json": {"groups": len(groups), "arrays": entries}}
    for k, parts in enumerate(groups.values()):
        members[f"arrays-{k}.npy"] = np.concatenate(parts)
    return members


def from_contents(contents) -> object:
    """The object written by :func:`to_members`, from :class:`openipu.poplar.exefile.Contents`."""
    what = f"'{contents.fname}'"
    index = contents.json("arrays.json")
    if not isinstance(index, dict) or type(index.get("groups")) is not int or not isinstance(index.get("arrays"), list):
        raise executable_file_error(f"{what}: the array index is malformed")
    n_groups, entries = index["groups"], index["arrays"]
    if not 0 <= n_groups <= 64:
        raise executable_file_error(f"{what}: the array index names {n_groups} groups")
    flat: dict[int, np.ndarray] = {}

    def array(k):
        if type(k) is not int or not 0 <= k < len(entries):
            raise executable_file_error(f"{what}: a reference to array {k!r}, which does not exist")
        e = entries[k]
        if not (isinstance(e, list) and len(e) == 3 and type(e[0]) is int and type(e[1]) is int
                and isinstance(e[2], list) and all(type(d) is int and d >= 0 for d in e[2]) and len(e[2]) <= 32):
            raise executable_file_error(f"{what}: array {k}'s index entry is malformed")
        g, off, shape = e
        if not 0 <= g < n_groups:
            raise executable_file_error(f"{what}: array {k} is in group {g}, which does not exist")
        if g not in flat:
            a = contents.array(f"arrays-{g}.npy")
            if a.ndim != 1:
                raise executable_file_error(f"{what}: array group {g} is not flat")
            flat[g] = a
        size = math.prod(shape)
        if not 0 <= off <= flat[g].size - size:
            raise executable_file_error(f"{what}: array {k} lies outside its group")
        return flat[g][off:off + size].reshape(shape)

    return decode(contents.json("records.json"), array, what)
