"""Reading ``profile.pop`` as untrusted data: the SQLite and ``.npy`` layer under ``pva.openReport``.

A profile is a file anyone can hand you, so this module treats it as hostile input
(docs/profile-format.md, "Trust"):

- the file must be a regular file of at most :data:`MAX_PROFILE_BYTES`, starting with the
  SQLite header; SQLite opens it through a ``file:...?mode=ro&immutable=1`` URI (no journal,
  WAL or lock files are read or created), with ``PRAGMA trusted_schema=OFF``, ``query_only``,
  ``cell_size_check``, no attachable databases (``SQLITE_LIMIT_ATTACHED`` = 0, which also stops
  ``VACUUM INTO``), a bounded BLOB length, and an authorizer that lets the connection only
  ``SELECT`` from the main database (a few functions, ``PRAGMA table_xinfo``);
- ``sqlite_master`` is checked before any table is read: a view, trigger, virtual table or
  hand-written index is refused (they are how a file would make a reader run SQL of its
  choosing, e.g. a recursive view that never ends), and so is a generated column;
- every query runs under a progress handler that interrupts it after
  :data:`QUERY_TIME_LIMIT_SECONDS` of host time;
- the expected tables and columns and the type of every value are checked, then the
  cross-references (ids, program tree, arrays named by rows) and every array's dtype and shape;
- every ``.npy`` BLOB is decoded by checking its header first (format version, header length,
  a plain numeric dtype, at most 8 dimensions, ``prod(shape) * itemsize`` equal to the payload
  size and at most :data:`MAX_ARRAY_BYTES`) and only then viewing its bytes (never a pickle).

Sources: SQLite's "Defense Against The Dark Arts" (https://www.sqlite.org/security.html: read-only
and immutable URIs, ``trusted_schema``, ``cell_size_check``, limits, authorizer, progress
handler; https://www.sqlite.org/uri.html), the ``.npy`` format (NEP 1,
https://numpy.org/neps/nep-0001-npy-format.html).

Anything wrong raises :class:`~openipu.popvision.errors.CorruptReport` (or ``NotAReport`` /
``UnsupportedFormat``) with one line saying what; a missing file raises ``FileNotFoundError``.
After :func:`read_profile` returns, every id, index and shape the report objects use is
known to be in range, so the lazily built parts of a report cannot fail on the data.
"""

from __future__ import annotations

import ast
import math
import os
import re
import sqlite3
import stat
import time
import urllib.parse

import numpy as np

from openipu.popvision.errors import CorruptReport, NotAReport, UnsupportedFormat

#: Format versions this reader reads (docs/profile-format.md).
SUPPORTED_FORMAT_VERSIONS = (1,)
#: Host wall time (seconds) one SQL query of the reader may take before it is interrupted.
QUERY_TIME_LIMIT_SECONDS = 5.0
#: Largest profile file read (bytes); light ResNet-50's is 1.6 MB.
MAX_PROFILE_BYTES = 2 << 30
#: Largest array (``.npy`` payload, bytes) and so the largest BLOB SQLite will return.
MAX_ARRAY_BYTES = 512 << 20
#: Most rows read from one table.
MAX_TABLE_ROWS = 4_000_000
#: Bounds on the target a profile describes (a Pod256 has 256 IPUs of 1,472 tiles).
MAX_IPUS = 1024
MAX_TILES_PER_IPU = 65_536
MAX_TILES = 1 << 20
#: Largest magnitude of a cycle figure (so sums over categories and IPUs stay exact int64s).
MAX_CYCLES = 1e18
#: Most execution-trace entries per run (the engine records the first 100,000).
MAX_TRACE_STEPS = 100_000

_MAGIC = "openipu-profile"
_SQLITE_HEADER = b"SQLite format 3\x00"
_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 4096
_NPY_HEADER_RE = re.compile(rb"\{'descr': '([<>|=]?[biuf]\d{1,2})', 'fortran_order': (True|False), "
                            rb"'shape': \(((?:\d{1,18}, ?)*\d{0,18})\), \} *\n")
_PROGRESS_OPS = 1000            # SQLite VM instructions between two deadline checks
_EXEC_CATEGORIES = ("compute", "exchange", "global_exchange", "host_exchange", "sync")

_NUM = (int, float)
_TEXT_OR_NULL = (str, type(None))
_INT_OR_NULL = (int, type(None))
#: table -> (((column, allowed Python types of its values), ...), ORDER BY)
_TABLES = {
    "meta": ((("key", (str,)), ("value", (str,))), None),
    "target": ((("key", (str,)), ("value", (int, float, str))), None),
    "graph": ((("key", (str,)), ("value", (int,))), None),
    "memory_categories": ((("position", (int,)), ("name", (str,)), ("array", (str,))), "position"),
    "variables": ((("id", (int,)), ("name", _TEXT_OR_NULL), ("type", (str,)), ("shape", (str,)),
                   ("bytes", (int,)), ("num_tiles", (int,)), ("constant", (int,)), ("always_live", _INT_OR_NULL)),
                  "id"),
    "vertex_types": ((("id", (int,)), ("name", _TEXT_OR_NULL), ("count", (int,)), ("state_bytes", _NUM),
                      ("code_bytes", _NUM), ("cycles", _NUM)), "id"),
    "compute_sets": ((("id", (int,)), ("name", _TEXT_OR_NULL), ("num_vertices", (int,)), ("num_tiles", (int,))),
                     "id"),
    "compute_set_vertices": ((("compute_set", (int,)), ("vertex_type", (int,)), ("count", (int,))), "rowid"),
    "steps": ((("idx", (int,)), ("type", (str,)), ("name", _TEXT_OR_NULL), ("compute_set", _INT_OR_NULL),
               ("flops", _NUM), ("tile_cycles", _TEXT_OR_NULL)), "idx"),
    "programs": ((("id", (int,)), ("parent", (int,)), ("position", (int,)), ("type", (str,)),
                  ("name", _TEXT_OR_NULL), ("step", _INT_OR_NULL), ("repeat_count", _INT_OR_NULL), ("root", (int,))),
                 "id"),
    "runs": ((("id", (int,)), ("program", (int,)), ("name", _TEXT_OR_NULL), ("host_seconds", _NUM),
              ("dry", (int,))), "id"),
    "arrays": ((("name", (str,)), ("data", (bytes,))), None),
}
_ALLOWED_FUNCTIONS = frozenset({"count", "typeof", "length"})
_SHAPE_RE = re.compile(r"(?:\d{1,18}(?:,\d{1,18})*)?\Z")
_VERSION_RE = re.compile(r"\d{1,6}\.\d{1,6}\.\d{1,6}")


def _q(value, n: int = 60) -> str:
    """A value read from the file, quoted for a one-line message (``repr`` escapes control
    characters, so a crafted name cannot break the line or drive the terminal)."""
    return repr(value[:n] if isinstance(value, (str, bytes)) else value)


def _authorize(action, arg1, arg2, db_name, _trigger):
    """SQLite authorizer of the reader's connection: SELECT from the main database only."""
    if action == sqlite3.SQLITE_SELECT:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_READ and db_name in ("main", None):    # None: count(*), a WITH table
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _ALLOWED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() == "table_xinfo":
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class _Connection:
    """A read-only, untrusted SQLite connection to one profile (see the module docstring).

    ``query(sql)`` returns at most :data:`MAX_TABLE_ROWS` rows and interrupts a query that runs
    longer than :data:`QUERY_TIME_LIMIT_SECONDS`; both raise :class:`CorruptReport`, as does any
    SQLite error."""

    def __init__(self, path: str):
        self.path = path
        self._deadline = math.inf
        self._timed_out = False
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro&immutable=1"
        try:
            con = sqlite3.connect(uri, uri=True, isolation_level=None, detect_types=0, cached_statements=0)
        except sqlite3.Error as e:
            raise CorruptReport(f"Cannot open profile '{path}': {e}") from None
        self.con = con
        try:
            con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ARRAY_BYTES + 4096)
            for pragma in ("trusted_schema=OFF", "query_only=ON", "cell_size_check=ON", "mmap_size=0"):
                con.execute(f"PRAGMA {pragma}")
            con.set_authorizer(_authorize)
            con.set_progress_handler(self._tick, _PROGRESS_OPS)
        except sqlite3.Error as e:
            con.close()
            raise CorruptReport(f"Cannot open profile '{path}': {e}") from None

    def _tick(self) -> int:
        if time.monotonic() > self._deadline:
            self._timed_out = True
            return 1
        return 0

    def query(self, sql: str, what: str, params=()) -> list:
        """Rows of ``sql`` (``what`` names it in errors)."""
        self._timed_out = False
        self._deadline = time.monotonic() + QUERY_TIME_LIMIT_SECONDS
        try:
            cur = self.con.execute(sql, params)
            rows = cur.fetchmany(MAX_TABLE_ROWS + 1)
            cur.close()
        except (sqlite3.Error, OverflowError, MemoryError) as e:
            if self._timed_out:
                raise CorruptReport(f"Profile '{self.path}': reading {what} took over {QUERY_TIME_LIMIT_SECONDS:g} s "
                                    f"and was stopped (a damaged or crafted file)") from None
            raise CorruptReport(f"Profile '{self.path}' is damaged: reading {what}: {_q(str(e), 200)}") from None
        finally:
            self._deadline = math.inf
        if len(rows) > MAX_TABLE_ROWS:
            raise CorruptReport(f"Profile '{self.path}': {what} has over {MAX_TABLE_ROWS:,} rows")
        return rows

    def close(self) -> None:
        self.con.close()


def open_connection(path: str) -> _Connection:
    """The reader's read-only, untrusted connection to the SQLite file ``path`` (for tests and
    tools; :func:`read_profile` uses it). Raises :class:`CorruptReport` if SQLite cannot open it."""
    return _Connection(path)


def load_npy(blob, name: str = "array", path: str = "") -> np.ndarray:
    """Decode one ``.npy`` BLOB without trusting it: the header is checked against the BLOB's
    size (numeric dtype, ``prod(shape) * itemsize`` = payload bytes <= :data:`MAX_ARRAY_BYTES`)
    before anything is allocated; no pickle is ever loaded. Returns a writable array. Raises
    :class:`CorruptReport` naming the array (``name``) and profile (``path``)."""
    def bad(why):
        return CorruptReport(f"Profile '{path}': array {_q(name)} is damaged: {why}")
    if not isinstance(blob, bytes):
        raise bad("not a BLOB")
    if len(blob) < 10 or not blob.startswith(_NPY_MAGIC):
        raise bad("not a .npy array")
    major = blob[6]
    if major == 1:
        hlen, start = int.from_bytes(blob[8:10], "little"), 10
    elif major in (2, 3):
        hlen, start = int.from_bytes(blob[8:12], "little"), 12
    else:
        raise bad(f".npy format version {major}")
    if hlen > _NPY_MAX_HEADER or start + hlen > len(blob):
        raise bad(f".npy header of {hlen:,} bytes")
    text = blob[start:start + hlen]
    m = _NPY_HEADER_RE.fullmatch(text)
    if m:                             # the header np.save writes, parsed without evaluating anything
        descr, fortran = m.group(1).decode(), m.group(2) == b"True"
        shape = tuple(int(d) for d in m.group(3).split(b",") if d.strip())
    else:
        try:
            header = ast.literal_eval(text.decode("latin1" if major < 3 else "utf8"))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeDecodeError):
            raise bad("unreadable .npy header") from None
        if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
            raise bad("unreadable .npy header")
        descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if not isinstance(descr, str) or not re.fullmatch(r"[<>|=]?[biuf]\d{1,2}", descr):
        raise bad(f"dtype {descr!r} is not a plain number type (objects and records are refused)")
    try:
        dtype = np.dtype(descr)
    except TypeError:
        raise bad(f"dtype {descr!r}") from None
    if (not isinstance(fortran, bool) or not isinstance(shape, tuple) or len(shape) > 8
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise bad("unreadable .npy header")
    count = math.prod(shape)
    payload = len(blob) - start - hlen
    if count * dtype.itemsize > MAX_ARRAY_BYTES:
        raise bad(f"shape {shape} needs {count * dtype.itemsize:,} bytes, over the limit of {MAX_ARRAY_BYTES:,}")
    if count * dtype.itemsize != payload:
        raise bad(f"shape {shape} of {dtype} needs {count * dtype.itemsize:,} bytes but the BLOB holds {payload:,}")
    a = np.frombuffer(blob, dtype=dtype, count=count, offset=start + hlen)
    return a.reshape(shape, order="F" if fortran else "C").copy()


def _check_file(path: str) -> None:
    """The cheap checks before SQLite sees the file: regular file, size, SQLite header."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"No such profile: '{path}'") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAReport(f"'{path}' is not a profile report (profile.pop): not a regular file")
        head = os.read(fd, 100)
    finally:
        os.close(fd)
    if not head.startswith(_SQLITE_HEADER):
        raise NotAReport(f"'{path}' is not a profile report (profile.pop): not an openipu/Poplar profile file")
    if len(head) < 100:
        raise CorruptReport(f"Profile '{path}' is truncated ({len(head)} bytes)")
    if st.st_size > MAX_PROFILE_BYTES:
        raise CorruptReport(f"Profile '{path}' is {st.st_size:,} bytes, over the reader's limit of "
                            f"{MAX_PROFILE_BYTES:,}")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise CorruptReport(f"Profile '{path}' is damaged: SQLite page size {page_size}")
    pages = int.from_bytes(head[28:32], "big")
    if pages and st.st_size < pages * page_size:
        raise CorruptReport(f"Profile '{path}' is truncated: {st.st_size:,} bytes of {pages * page_size:,}")


def _check_schema(con: _Connection) -> set:
    """Refuse views, triggers, virtual tables and hand-written indexes; return the table names."""
    path = con.path
    objects = con.query("SELECT type, name, rootpage, sql FROM sqlite_master", "the schema")
    names = {r[1] for r in objects}
    if "meta" not in names:
        raise NotAReport(f"'{path}' is an SQLite file but not a profile report (no meta table)")
    tables = set()
    for kind, name, rootpage, sql in objects:
        if kind == "table":
            # a virtual table has no b-tree of its own (rootpage 0), whatever its SQL text says
            if rootpage == 0 or not isinstance(rootpage, int) or (
                    isinstance(sql, str) and re.match(r"\s*CREATE\s+VIRTUAL\s", sql, re.IGNORECASE)):
                raise CorruptReport(f"Profile '{path}' has a virtual table {_q(name)}; a profile holds only "
                                    "plain tables (refused)")
            tables.add(name)
        elif kind == "index" and sql is None:
            pass                       # SQLite's own index of a PRIMARY KEY / UNIQUE column
        else:
            what = kind if kind in ("view", "trigger", "index") else _q(kind)
            raise CorruptReport(f"Profile '{path}' has {'an' if kind == 'index' else 'a'} {what} {_q(name)}; "
                                "a profile holds only plain tables (refused)")
    return tables


def _columns(con: _Connection, table: str) -> None:
    """Check that ``table`` has the expected columns and no generated (computed) ones."""
    cols = con.query(f"PRAGMA table_xinfo(\"{table}\")", f"the columns of table '{table}'")
    have = {r[1]: r[6] for r in cols}
    generated = [n for n, hidden in have.items() if hidden]
    if generated:
        raise CorruptReport(f"Profile '{con.path}': table '{table}' has generated column(s) {generated} (refused)")
    missing = [c for c, _ in _TABLES[table][0] if c not in have]
    if missing:
        raise CorruptReport(f"Profile '{con.path}' is damaged: table '{table}' lacks column(s) {', '.join(missing)}")


def _read_table(con: _Connection, table: str) -> list:
    cols, order = _TABLES[table]
    sql = f"SELECT {', '.join(c for c, _ in cols)} FROM \"{table}\"" + (f" ORDER BY {order}" if order else "")
    rows = con.query(sql, f"table '{table}'")
    if rows:
        for (col, allowed), values in zip(cols, zip(*rows)):
            wrong = set(map(type, values)).difference(allowed)
            if wrong:
                got = ", ".join(sorted(("NULL" if t is type(None) else t.__name__) for t in wrong))
                raise CorruptReport(f"Profile '{con.path}' is damaged: column {table}.{col} holds {got} values")
    return rows


def _int(value, what: str, path: str, lo: int = 0, hi: int = 1 << 62) -> int:
    """An integer field of a key/value table, in [lo, hi]."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value):
        value = int(value)
    if type(value) is not int or not lo <= value <= hi:
        raise CorruptReport(f"Profile '{path}' is damaged: {what} is {_q(value)} (expected an integer in "
                            f"[{lo:,}, {hi:,}])")
    return value


def _check_meta(meta: dict, path: str) -> None:
    if meta.get("magic") != _MAGIC:
        magic = meta.get("magic")
        raise NotAReport(f"'{path}' is not a profile report (meta.magic is {_q(magic)})")
    ver = meta.get("format_version", "")
    if not re.fullmatch(r"-?\d{1,9}", ver):
        raise CorruptReport(f"Profile '{path}' has an unreadable format version {ver[:40]!r}")
    ver = int(ver)
    if ver not in SUPPORTED_FORMAT_VERSIONS:
        age = "an older" if ver < min(SUPPORTED_FORMAT_VERSIONS) else "a newer"
        raise UnsupportedFormat(
            f"Profile '{path}' has {age} format version {ver}; this reader supports version(s) "
            f"{', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))}. Regenerate the profile with this openipu")
    if not _VERSION_RE.match(meta.get("poplar_version", "0.0.0")):
        raise CorruptReport(f"Profile '{path}' is damaged: meta.poplar_version is {meta['poplar_version'][:40]!r}")
    try:
        float(meta.get("compile_host_seconds", "nan"))
    except ValueError:
        raise CorruptReport(f"Profile '{path}' is damaged: meta.compile_host_seconds is "
                            f"{meta['compile_host_seconds'][:40]!r}") from None


def _check_target(t: dict, path: str) -> None:
    """Check and convert the target's fields in place (bounded, consistent)."""
    for k in ("version", "arch", "type", "numIPUs", "tilesPerIPU", "numTiles", "bytesPerTile", "clockHz",
              "replicationFactor"):
        if k not in t:
            raise CorruptReport(f"Profile '{path}' is damaged: target.{k} is missing")
    for k in ("version", "arch", "type"):
        if not isinstance(t[k], str):
            raise CorruptReport(f"Profile '{path}' is damaged: target.{k} is {_q(t[k])}")
    t["numIPUs"] = _int(t["numIPUs"], "target.numIPUs", path, 1, MAX_IPUS)
    t["tilesPerIPU"] = _int(t["tilesPerIPU"], "target.tilesPerIPU", path, 1, MAX_TILES_PER_IPU)
    t["numTiles"] = _int(t["numTiles"], "target.numTiles", path, 1, MAX_TILES)
    if t["numTiles"] != t["numIPUs"] * t["tilesPerIPU"]:
        raise CorruptReport(f"Profile '{path}' is damaged: target.numTiles {t['numTiles']:,} is not numIPUs x "
                            f"tilesPerIPU ({t['numIPUs']} x {t['tilesPerIPU']})")
    t["bytesPerTile"] = _int(t["bytesPerTile"], "target.bytesPerTile", path, 1, 1 << 40)
    t["replicationFactor"] = _int(t["replicationFactor"], "target.replicationFactor", path, 1, 1 << 20)
    t["numWorkerContexts"] = _int(t.get("numWorkerContexts", 6), "target.numWorkerContexts", path, 1, 1024)
    clock = t["clockHz"]
    if not isinstance(clock, (int, float)) or not 0 < clock < 1e15:   # also refuses NaN
        raise CorruptReport(f"Profile '{path}' is damaged: target.clockHz is {_q(clock)}")


def _array(arrays: dict, name: str, path: str, shape: tuple, kinds: str = "iuf", finite: bool = False,
           required: bool = True):
    a = arrays.get(name)
    if a is None:
        if required:
            raise CorruptReport(f"Profile '{path}' lacks the array {_q(name)}")
        return None
    if a.dtype.kind not in kinds or any(want is not None and got != want for got, want in zip(a.shape, shape)) \
            or a.ndim != len(shape):
        want = "x".join("n" if d is None else str(d) for d in shape)
        raise CorruptReport(f"Profile '{path}' is damaged: array {_q(name)} is {a.dtype} {a.shape}, expected "
                            f"[{want}] of {'integers' if kinds == 'iu' else 'numbers'}")
    if finite and a.size and not np.abs(a.astype(np.float64)).max() <= MAX_CYCLES:     # NaN fails too
        raise CorruptReport(f"Profile '{path}' is damaged: array {_q(name)} holds NaN, infinity or values "
                            f"beyond {MAX_CYCLES:g}")
    return a


def _ids(rows, what: str, path: str) -> set:
    ids = [r[0] for r in rows]
    if len(set(ids)) != len(ids):
        raise CorruptReport(f"Profile '{path}' is damaged: {what} ids repeat")
    return set(ids)


def _check_tables(data: dict, arrays: dict, path: str) -> None:
    """Cross-check the tables and arrays: every id, index and shape the report uses."""
    t = data["target"]
    tiles, ipus = t["numTiles"], t["numIPUs"]
    for k in ("numVertices", "numEdges", "numVariables", "numComputeSets"):
        if k not in data["graph"]:
            raise CorruptReport(f"Profile '{path}' is damaged: graph.{k} is missing")
    _array(arrays, "memory/total", path, (tiles,), "iu")
    _array(arrays, "memory/alwaysLiveVariables", path, (tiles,), "iu", required=False)
    _array(arrays, "memory/notAlwaysLivePeak", path, (tiles,), "iu", required=False)
    _array(arrays, "memory/outOfMemoryTiles", path, (None,), "iu", required=False)
    for _, name, arr in data["memory_categories"]:
        _array(arrays, arr, path, (tiles,), "iu")
    steps = data["steps"]
    n = len(steps)
    if [r[0] for r in steps] != list(range(n)):
        raise CorruptReport(f"Profile '{path}' is damaged: steps.idx is not 0, 1, ... {n - 1}")
    live = _array(arrays, "liveness/notAlwaysLive", path, (None,), "iu")
    if live.size > max(n, 1):
        raise CorruptReport(f"Profile '{path}' is damaged: liveness has {live.size:,} steps, the profile {n:,}")
    _array(arrays, "liveness/notAlwaysLiveByIpu", path, (ipus, live.size), "iu", required=False)
    for c in _EXEC_CATEGORIES:
        _array(arrays, f"steps/cycles/{c}", path, (n, ipus), finite=True)
    cs_ids = _ids(data["compute_sets"], "compute set", path)
    vt_ids = _ids(data["vertex_types"], "vertex type", path)
    for cs, vt, _ in data["compute_set_vertices"]:
        if cs not in cs_ids or vt not in vt_ids:
            raise CorruptReport(f"Profile '{path}' is damaged: compute_set_vertices names compute set {cs} / "
                                f"vertex type {vt}, which do not exist")
    for idx, _, _, cs, _, key in steps:
        if cs is not None and cs not in cs_ids:
            raise CorruptReport(f"Profile '{path}' is damaged: step {idx} names compute set {cs}, which does not exist")
        if key is not None:
            _array(arrays, key, path, (tiles,), finite=True)
    progs = data["programs"]
    if [r[0] for r in progs] != list(range(len(progs))):
        raise CorruptReport(f"Profile '{path}' is damaged: programs.id is not 0, 1, ... {len(progs) - 1}")
    for pid, parent, _, _, _, step, _, _ in progs:
        if not (parent == -1 or 0 <= parent < pid):      # parents come first: the tree has no cycles
            raise CorruptReport(f"Profile '{path}' is damaged: program {pid} has parent {parent}")
        if step is not None and not 0 <= step < n:
            raise CorruptReport(f"Profile '{path}' is damaged: program {pid} runs step {step} of {n}")
    for _, _, _, shape, *_ in data["variables"]:
        if not _SHAPE_RE.match(shape):
            raise CorruptReport(f"Profile '{path}' is damaged: a variable's shape is {shape[:40]!r}")
    peak = _array(arrays, "liveness/peakVariables", path, (None,), "iu", required=False)
    if peak is not None and peak.size:
        var_ids = _ids(data["variables"], "variable", path)
        if not set(peak.tolist()) <= var_ids:
            raise CorruptReport(f"Profile '{path}' is damaged: liveness/peakVariables names variables that do not "
                                "exist")
    _ids(data["runs"], "run", path)
    for i, *_ in data["runs"]:
        _array(arrays, f"runs/{i}/cyclesPerIpu", path, (ipus,), finite=True)
        _array(arrays, f"runs/{i}/counts", path, (n,), "iu")
        idx = _array(arrays, f"runs/{i}/trace/step", path, (None,), "iu")
        _array(arrays, f"runs/{i}/trace/end", path, (idx.size,), finite=True)
        if idx.size > MAX_TRACE_STEPS:
            raise CorruptReport(f"Profile '{path}' is damaged: run {i} has a trace of {idx.size:,} steps (at most "
                                f"{MAX_TRACE_STEPS:,})")
        if idx.size and not (0 <= int(idx.min()) and int(idx.max()) < n):
            raise CorruptReport(f"Profile '{path}' is damaged: run {i}'s trace names steps outside 0..{n - 1}")


def read_profile(path: str) -> tuple[dict, dict]:
    """Read and check a whole profile: ``({table: rows, "meta"/"target"/"graph": {key: value}},
    {array name: ndarray})``. Raises ``FileNotFoundError``, :class:`NotAReport`,
    :class:`UnsupportedFormat` or :class:`CorruptReport` (see the module docstring for what is
    checked); nothing in the file is executed and no file is created."""
    _check_file(path)
    con = _Connection(path)
    try:
        tables = _check_schema(con)
        _columns(con, "meta")
        meta = dict(_read_table(con, "meta"))
        _check_meta(meta, path)
        missing = [t for t in _TABLES if t not in tables]
        if missing:
            raise CorruptReport(f"Profile '{path}' is damaged: table(s) {', '.join(missing)} missing")
        for t in _TABLES:
            if t != "meta":
                _columns(con, t)
        data = {"meta": meta}
        for t in ("target", "graph"):
            data[t] = dict(_read_table(con, t))
        for t in ("memory_categories", "variables", "vertex_types", "compute_sets", "compute_set_vertices",
                  "steps", "programs", "runs"):
            data[t] = _read_table(con, t)
        blobs = _read_table(con, "arrays")
    finally:
        con.close()
    _check_target(data["target"], path)
    arrays = {n: load_npy(b, n, path) for n, b in blobs}
    _check_tables(data, arrays, path)
    return data, arrays
