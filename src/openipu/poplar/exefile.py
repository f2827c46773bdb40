"""openipu's executable file: a zip of data members (JSON, ``.npy`` arrays, an ONNX model), nothing else.

Poplar's ``Executable.serialize``, PopART's ``compileAndExport`` / ``saveExecutable`` / engine
cache, PopTorch's exported executables and PopRT's ``compile_and_export`` all write this container
with :func:`write` and read it with :func:`read`; what each front end puts in it is described in
``docs/executable-format.md`` (format version :data:`VERSION`).

A file is untrusted input. Reading it never runs code from it and never calls or imports anything
it names: the container only hands out bytes, JSON values and numpy arrays of plain dtypes; each
front end decodes its own members into its own classes (PopART and PopRT files hold the ONNX
model and options, which are compiled again as any model is; Poplar files hold the graph as typed
records, :mod:`openipu.poplar.graph_codec`). Before anything is decoded:

- the member names are checked (a short file name, no folders, no duplicates) against the manifest,
  which must list exactly the members the zip holds;
- every member's size is bounded (:data:`DEFAULT_MAX_BYTES` in all, overridable with
  ``OPENIPU_EXECUTABLE_MAX_BYTES`` or the ``max_bytes`` argument; JSON members at most
  :data:`MAX_JSON_BYTES`), and only JSON members may be compressed, so a small file cannot inflate
  into a large one; reading stops at the declared size;
- an array's ``.npy`` header is checked against its member's size before anything is allocated,
  and object or structured dtypes are refused (``numpy.load(allow_pickle=False)`` semantics).

Every refusal raises :class:`executable_file_error` (a ``poplar_error``) with one line saying what
is wrong; front ends re-raise it as their own API's exception.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile

import numpy as np

from openipu.poplar.errors import poplar_error

FORMAT = "openipu-executable"
#: Format version this build writes and reads. Version 1 held a generic object graph whose
#: records named classes and functions; it is refused (compile again).
VERSION = 2

#: Default bound on the sum of the members' sizes, bytes (16 GiB: the weights of the largest
#: model one IPU-POD16 holds, 16 x 900 MB, with room to spare). ``OPENIPU_EXECUTABLE_MAX_BYTES``
#: or ``read(..., max_bytes=...)`` overrides it.
DEFAULT_MAX_BYTES = 16 << 30
#: Bound on each JSON member (the manifest included), bytes.
MAX_JSON_BYTES = 256 << 20
#: Bound on the number of members.
MAX_MEMBERS = 4096

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CHUNK = 1 << 20


class executable_file_error(poplar_error):  # noqa: N801 - Poplar's naming of errors
    """An executable file that cannot be read: not this format, another version, corrupt,
    truncated, tampered with, over a size bound, or holding records this openipu does not know."""


def max_bytes_default() -> int:
    """The size bound :func:`read` applies (bytes): ``OPENIPU_EXECUTABLE_MAX_BYTES`` if set to a
    positive integer, else :data:`DEFAULT_MAX_BYTES`."""
    env = os.environ.get("OPENIPU_EXECUTABLE_MAX_BYTES")
    if env:
        try:
            v = int(env)
            if v > 0:
                return v
        except ValueError:
            pass
        raise executable_file_error(f"OPENIPU_EXECUTABLE_MAX_BYTES must be a positive integer of bytes, not {env!r}")
    return DEFAULT_MAX_BYTES


# ----------------------------------------------------------------------------------------------
# arrays as .npy bytes
# ----------------------------------------------------------------------------------------------
def npy_bytes(a: np.ndarray) -> bytes:
    """``a`` in the ``.npy`` format (C order, no pickle). Raises :class:`executable_file_error`
    for object or structured dtypes."""
    a = np.asarray(a)
    if a.dtype.hasobject or a.dtype.fields is not None:
        raise executable_file_error(f"Cannot save an array of dtype {a.dtype}: only plain numeric dtypes are stored")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def npy_array(data, what: str = "array") -> np.ndarray:
    """The array in ``.npy`` bytes ``data`` (``bytes`` or ``bytearray``; a ``bytearray`` gives a
    writable array without a copy). The header is checked before any allocation: version 1-3,
    a plain dtype (no objects, no fields), a non-negative shape whose size times the item size
    is exactly the payload. Raises :class:`executable_file_error`."""
    f = io.BytesIO(data)
    try:
        major, _ = np.lib.format.read_magic(f)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=10000)
        elif major in (2, 3):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=10000)
        else:
            raise ValueError(f".npy version {major}")
    except executable_file_error:
        raise
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError, SyntaxError, UnicodeError ...
        raise executable_file_error(f"{what}: not a valid .npy array ({type(e).__name__}: {e})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        raise executable_file_error(f"{what}: dtype {dtype} is not a plain numeric dtype")
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise executable_file_error(f"{what}: malformed shape {shape!r}")
    count = 1
    for d in shape:
        count *= d
    offset = f.tell()
    if count * dtype.itemsize != len(data) - offset:
        raise executable_file_error(f"{what}: the header's shape {list(shape)} x {dtype.itemsize} bytes does not "
                                    f"match the {len(data) - offset} bytes that follow it")
    a = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return a.reshape(shape, order="F" if fortran else "C")


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------
def _json_bytes(v) -> bytes:
    try:
        return json.dumps(v, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise executable_file_error(f"Cannot save a value as JSON: {e}") from None


def write(f, kind: str, members: dict, meta: dict | None = None) -> None:
    """Write an executable file to ``f`` (a path or a writable binary file object).

    Args:
        kind: what the file holds (checked by :func:`read`), e.g. ``"poplar.Executable"``.
        members: name -> content: a name ending ``.json`` takes a JSON value (no NaN or infinity),
            ``.npy`` a numpy array, anything else ``bytes``. Names are short file names.
        meta: JSON facts for the front end, stored in the manifest (read without the members).
    Raises:
        executable_file_error: a bad member name or a value with no JSON / ``.npy`` form.
    """
    data: dict[str, bytes] = {}
    for name, v in members.items():
        if not isinstance(name, str) or not _NAME.match(name) or name == "manifest.json":
            raise executable_file_error(f"Bad member name {name!r}")
        if name.endswith(".json"):
            data[name] = _json_bytes(v)
        elif name.endswith(".npy"):
            data[name] = npy_bytes(v)
        elif isinstance(v, (bytes, bytearray, memoryview)):
            data[name] = bytes(v)
        else:
            raise executable_file_error(f"Member {name!r} must be bytes, not {type(v).__name__}")
    manifest = {"format": FORMAT, "version": VERSION, "kind": kind, "writer": _writer(), "meta": meta or {},
                "members": {k: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for k, b in data.items()}}
    out = f if hasattr(f, "write") else open(os.fspath(f), "wb")
    try:
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("manifest.json", _json_bytes(manifest), compress_type=zipfile.ZIP_DEFLATED)
            for name, b in data.items():
                z.writestr(name, b, compress_type=zipfile.ZIP_DEFLATED if name.endswith(".json")
                           else zipfile.ZIP_STORED)
    finally:
        if out is not f:
            out.close()


def dumps(kind: str, members: dict, meta: dict | None = None) -> bytes:
    """The bytes :func:`write` would write."""
    buf = io.BytesIO()
    write(buf, kind, members, meta)
    return buf.getvalue()


def _writer() -> str:
    try:
        from openipu import __version__
    except ImportError:  # pragma: no cover
        __version__ = "?"
    return f"openipu {__version__}"


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------
class Contents:
    """The checked members of an executable file: ``manifest``, ``kind``, ``meta``, ``names``;
    :meth:`json`, :meth:`array` and :meth:`bytes` decode one member (each raises
    :class:`executable_file_error` for a missing or malformed member)."""

    def __init__(self, fname: str, manifest: dict, data: dict[str, bytearray]):
        self.fname, self.manifest, self._data = fname, manifest, data
        self.kind, self.meta = manifest["kind"], manifest["meta"]
        self.names = sorted(data)

    def has(self, name: str) -> bool:
        return name in self._data

    def bytes(self, name: str) -> bytearray:
        try:
            return self._data[name]
        except KeyError:
            raise executable_file_error(f"'{self.fname}' has no member '{name}': it is not a complete "
                                        f"{self.kind} file") from None

    def json(self, name: str):
        return _parse_json(self.bytes(name), f"'{self.fname}': member '{name}'")

    def array(self, name: str) -> np.ndarray:
        return npy_array(self.bytes(name), f"'{self.fname}': member '{name}'")


def _parse_json(b, what: str):
    if len(b) > MAX_JSON_BYTES:
        raise executable_file_error(f"{what} is larger than {MAX_JSON_BYTES} bytes")
    def no_constant(c):
        raise ValueError(f"{c} is not a JSON number")
    try:        # json's parser bounds its own recursion: a deeply nested text raises RecursionError
        return json.loads(bytes(b), parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise executable_file_error(f"{what} is not valid JSON ({type(e).__name__}: {e})") from None


def _open_zip(f, max_bytes: int):
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        if not os.path.isfile(path):
            raise executable_file_error(f"No executable file at '{path}'")
        if os.path.getsize(path) > max_bytes + (64 << 20):
            raise executable_file_error(f"'{path}' is larger than the {max_bytes}-byte bound on executables "
                                        "(set OPENIPU_EXECUTABLE_MAX_BYTES to raise it)")
        return zipfile.ZipFile(path), path
    if not hasattr(f, "read"):
        raise executable_file_error(f"An executable is read from a path or a binary file object, not "
                                    f"{type(f).__name__}")
    data = f.read(max_bytes + (64 << 20) + 1)
    if not isinstance(data, (bytes, bytearray)):
        raise executable_file_error("The file object must be opened in binary mode")
    if len(data) > max_bytes + (64 << 20):
        raise executable_file_error(f"The stream is larger than the {max_bytes}-byte bound on executables")
    return zipfile.ZipFile(io.BytesIO(data)), getattr(f, "name", "<stream>")


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, fname: str) -> bytearray:
    """The member's bytes, reading at most ``size`` bytes (the declared size) and refusing more."""
    out = bytearray()
    try:
        with z.open(info) as m:
            while len(out) < size:
                chunk = m.read(min(_CHUNK, size - len(out)))
                if not chunk:
                    break
                out += chunk
            if len(out) != size or m.read(1):
                raise executable_file_error(f"'{fname}': member '{info.filename}' is not of its declared size")
    except executable_file_error:
        raise
    except Exception as e:  # noqa: BLE001 - zlib.error, CRC errors, EOFError, NotImplementedError ...
        raise executable_file_error(f"'{fname}': member '{info.filename}' is corrupt ({type(e).__name__}: {e})") \
            from None
    return out


def read(f, kind: str | tuple | None = None, max_bytes: int | None = None) -> Contents:
    """Open and check an executable file; returns its :class:`Contents`.

    Args:
        f: a path or a readable binary file object.
        kind: the expected ``kind`` (or a tuple of accepted kinds); ``None`` accepts any.
        max_bytes: bound on the members' total size in bytes (default :func:`max_bytes_default`).
    Raises:
        executable_file_error: missing file, not a zip, truncated or corrupt, another format or
            version, another kind, member names or sizes that break the rules of the module
            docstring, or a member whose SHA-256 differs from the manifest.
    """
    limit = max_bytes_default() if max_bytes is None else int(max_bytes)
    try:
        z, fname = _open_zip(f, limit)
    except executable_file_error:
        raise
    except Exception as e:  # noqa: BLE001 - BadZipFile, LargeZipFile, OSError, ValueError, EOFError ...
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<stream>"
        raise executable_file_error(f"'{name}' is not an openipu executable file, or it is truncated or corrupt "
                                    f"({type(e).__name__}: {e})") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS + 1:
            raise executable_file_error(f"'{fname}' has {len(infos)} members; an executable has at most {MAX_MEMBERS}")
        by_name: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not _NAME.match(info.filename) or info.filename in by_name:
                raise executable_file_error(f"'{fname}': bad or repeated member name {info.filename[:80]!r}")
            by_name[info.filename] = info
        mi = by_name.get("manifest.json")
        if mi is None:
            raise executable_file_error(f"'{fname}' is not an openipu executable file (it has no manifest)")
        if mi.file_size > MAX_JSON_BYTES:
            raise executable_file_error(f"'{fname}': the manifest is larger than {MAX_JSON_BYTES} bytes")
        man = _parse_json(_read_member(z, mi, mi.file_size, fname), f"'{fname}': the manifest")
        _check_manifest(man, fname, kind)
        declared = man["members"]
        if set(declared) != set(by_name) - {"manifest.json"}:
            raise executable_file_error(f"'{fname}': the manifest's members {sorted(declared)[:8]} are not the "
                                        f"file's {sorted(set(by_name) - {'manifest.json'})[:8]}")
        total = 0
        for name, d in declared.items():
            info = by_name[name]
            size = d["size"]
            if info.file_size != size:
                raise executable_file_error(f"'{fname}': member '{name}' is {info.file_size} bytes, the manifest "
                                            f"says {size}")
            if name.endswith(".json"):
                if size > MAX_JSON_BYTES:
                    raise executable_file_error(f"'{fname}': member '{name}' is larger than {MAX_JSON_BYTES} bytes")
            elif info.compress_type != zipfile.ZIP_STORED:
                raise executable_file_error(f"'{fname}': member '{name}' is compressed; only JSON members may be")
            total += size
            if total > limit:
                raise executable_file_error(f"'{fname}': its members exceed the {limit}-byte bound on executables "
                                            "(set OPENIPU_EXECUTABLE_MAX_BYTES to raise it)")
        data = {}
        for name, d in declared.items():
            b = _read_member(z, by_name[name], d["size"], fname)
            if hashlib.sha256(b).hexdigest() != d["sha256"]:
                raise executable_file_error(f"'{fname}': member '{name}' does not match its SHA-256 in the manifest "
                                            "(the file was modified or damaged)")
            data[name] = b
    return Contents(fname, man, data)


def _check_manifest(man, fname: str, kind) -> None:
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise executable_file_error(f"'{fname}' is not an openipu executable file (format "
                                    f"{man.get('format') if isinstance(man, dict) else None!r}, expected '{FORMAT}')")
    if man.get("version") != VERSION:
        raise executable_file_error(f"'{fname}' is an openipu executable of format version {man.get('version')!r}; "
                                    f"this openipu reads version {VERSION}. Compile the model again")
    kinds = (kind,) if isinstance(kind, str) else kind
    if not isinstance(man.get("kind"), str) or (kinds is not None and man["kind"] not in kinds):
        raise executable_file_error(f"'{fname}' holds a '{man.get('kind')}', not a {' or '.join(kinds or ('kind',))}")
    if not isinstance(man.get("meta"), dict):
        raise executable_file_error(f"'{fname}': the manifest's meta is not an object")
    members = man.get("members")
    if not isinstance(members, dict):
        raise executable_file_error(f"'{fname}': the manifest lists no members")
    for name, d in members.items():
        if not (_NAME.match(name) and isinstance(d, dict) and type(d.get("size")) is int and d["size"] >= 0
                and isinstance(d.get("sha256"), str)):
            raise executable_file_error(f"'{fname}': the manifest's entry for member {str(name)[:80]!r} is malformed")


def read_manifest(f, max_bytes: int | None = None) -> dict:
    """The manifest of an executable file (format, version, kind, meta, members), checked for
    format and version; members are checked for size but their contents are not hashed."""
    limit = max_bytes_default() if max_bytes is None else int(max_bytes)
    try:
        z, fname = _open_zip(f, limit)
    except executable_file_error:
        raise
    except Exception as e:  # noqa: BLE001
        raise executable_file_error(f"Not an openipu executable file, or truncated or corrupt "
                                    f"({type(e).__name__}: {e})") from None
    with z:
        try:
            mi = z.getinfo("manifest.json")
        except KeyError:
            raise executable_file_error(f"'{fname}' is not an openipu executable file (it has no manifest)") from None
        if mi.file_size > MAX_JSON_BYTES:
            raise executable_file_error(f"'{fname}': the manifest is larger than {MAX_JSON_BYTES} bytes")
        man = _parse_json(_read_member(z, mi, mi.file_size, fname), f"'{fname}': the manifest")
    _check_manifest(man, fname, None)
    return man
