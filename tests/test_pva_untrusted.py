"""Profiles are untrusted data: crafted and damaged ``profile.pop`` files must raise a ``pva.Error``
subclass (never a raw Python, SQLite or numpy error), never hang, and never create a file.

One real profile is built once (a small PopART MLP with a report directory). Each malformed
variant lives alone in its own directory and is opened by a child process (``pva.openReport``,
then every lazily built part: tiles, categories, liveness, program tree, execution steps, and
the HTML page), under a timeout that only guards against hangs. After the child exits, every
case directory and the child's working directory must hold exactly what they held before.
``PVA_FUZZ_CASES`` sets the number of seeded byte mutations (default 40).
"""

import io
import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

import openipu
import pva
from openipu import cli, runner
from test_popvision import _mlp

#: Hang guard only (not a performance limit): a whole batch of cases in one child process.
_BATCH_TIMEOUT = 600

_CHILD = r'''
import json, os, sys, traceback
import pva
from openipu.popvision import reader
from openipu.popvision.html import render

def walk(r):
    c = r.compilation
    for t in c.tiles:
        t.memory.total.includingGaps
    t = c.tiles[-1]
    for name in dir(t.memory.category):
        getattr(t.memory.category, name).overflowed.nonOverlapped
    [len(i.tiles) for i in c.ipus]
    c.totalMemory, c.worstTile(), c.livenessPeak()
    for v in c.variables:
        v.shape
    for cs in c.computeSets:
        cs.estimatedCyclesByTile.max() if cs.estimatedCyclesByTile.size else 0
    for s in c.livenessProgramSteps:
        s.notAlwaysLiveMemory.bytes
        s.notAlwaysLiveMemoryForIpu(0).bytes
        if s.program is not None:
            s.program.estimatedCyclesByTile
    for p in c.programs:
        p.children
        if p.step is not None:
            p.estimatedCyclesByTile
    c.controlPrograms
    r.execution.totalCycles.total
    for run in r.execution.runs:
        run.cyclesByIpu, run.programCounts
    for k, s in enumerate(r.execution.steps):
        [i.cycles for i in s.ipus]
        s.program.name
        if k < 50:
            s.cyclesByTile
    render(r)

for line in sys.stdin:
    case = json.loads(line)
    print(json.dumps({"start": case["name"]}), flush=True)
    if case.get("query_limit"):
        reader.QUERY_TIME_LIMIT_SECONDS = case["query_limit"]
    try:
        if case.get("sql"):
            con = reader.open_connection(case["path"])
            con.query(case["sql"], "a test query")
        else:
            walk(pva.openReport(case["path"]))
        out = {"result": "ok"}
    except pva.Error as e:
        out = {"result": type(e).__name__, "message": str(e)}
    except BaseException as e:
        out = {"result": "other", "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out["name"] = case["name"]
    print(json.dumps(out), flush=True)
'''


def _run_child(cases, cwd):
    """Run ``cases`` ({name, path, ...}) in one child process; return {name: result dict}."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(openipu.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    stdin = "".join(json.dumps(c) + "\n" for c in cases)
    try:
        p = subprocess.run([sys.executable, "-c", _CHILD], input=stdin, capture_output=True, text=True,
                           timeout=_BATCH_TIMEOUT, cwd=cwd, env=env)
        out = p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        started = [json.loads(x)["start"] for x in out.splitlines() if '"start"' in x]
        pytest.fail(f"pva hung (child killed after {_BATCH_TIMEOUT} s) on case {started[-1] if started else '?'}")
    results = {}
    for x in out.splitlines():
        d = json.loads(x)
        if "result" in d:
            results[d["name"]] = d
    missing = [c["name"] for c in cases if c["name"] not in results]
    assert not missing, f"child died before {missing}: {p.stderr[-2000:]}"
    return results


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """The bytes of a real profile (a small PopART MLP run with a report directory)."""
    d = tmp_path_factory.mktemp("untrusted-good")
    _mlp(d / "mlp.onnx")
    runner.run_model(str(d / "mlp.onnx"), report_dir=str(d / "rep"))
    return (d / "rep" / "profile.pop").read_bytes()


# ------------------------------------------------------------------------------------------------
# crafting helpers (the test writes these files with its own writable connection)
# ------------------------------------------------------------------------------------------------
def _npy(a, allow_pickle=False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def _npy_header(header: str, payload: bytes = b"") -> bytes:
    """A .npy (version 1.0) with a hand-written header."""
    h = header.encode("latin1")
    h += b" " * (-(10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + payload


def _sql(*statements, params=None):
    def apply(path):
        con = sqlite3.connect(path)
        for s in statements:
            if params is not None and "?" in s:
                con.execute(s, params)
            else:
                con.executescript(s)
        con.commit()
        con.close()
    return apply


def _set_array(name, blob):
    return _sql("UPDATE arrays SET data=? WHERE name='" + name + "'", params=(blob,))


def _bytes(fn):
    """A case written from the good file's bytes."""
    def apply(path):
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(fn(data))
    return apply


def _deep_tree(path):
    """A valid profile whose program tree is a 3,000-deep chain of Sequences (the HTML view and
    the reader must not recurse without bound)."""
    con = sqlite3.connect(path)
    n = con.execute("SELECT count(*) FROM programs").fetchone()[0]
    con.executemany("INSERT INTO programs VALUES (?, ?, 0, 'Sequence', '', NULL, NULL, 0)",
                    [(n + k, n + k - 1 if k else 0) for k in range(3000)])
    con.commit()
    con.close()


_RECURSIVE = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
_RNG_BYTES = np.random.default_rng(1234).integers(0, 256, 8192, dtype=np.uint8).tobytes()

#: name -> (how to damage a copy of the good profile, expected pva error class name, message regex)
CASES = {
    "recursive view replacing steps": (_sql(
        "DROP TABLE steps", f"CREATE VIEW steps AS {_RECURSIVE} SELECT n AS idx, 'Sync' AS type, '' AS name, "
        "NULL AS compute_set, 0.0 AS flops, NULL AS tile_cycles FROM r"), "CorruptReport", "view 'steps'"),
    "recursive view replacing meta": (_sql(
        "DROP TABLE meta", f"CREATE VIEW meta AS {_RECURSIVE} SELECT 'magic' AS key, 'openipu-profile' AS value "
        "FROM r"), "CorruptReport", "view 'meta'"),
    "extra recursive view": (_sql(f"CREATE VIEW x AS {_RECURSIVE} SELECT n FROM r"), "CorruptReport", "view 'x'"),
    "trigger": (_sql("CREATE TRIGGER t AFTER INSERT ON runs BEGIN DELETE FROM runs; END"), "CorruptReport",
                "trigger 't'"),
    "fts5 virtual table": (_sql(
        "DROP TABLE variables", "CREATE VIRTUAL TABLE variables USING fts5(id, name, type, shape, bytes, "
        "num_tiles, constant, always_live)"), "CorruptReport", "virtual table 'variables'"),
    "fts5 virtual table, SQL text disguised": (_sql(
        "DROP TABLE variables", "CREATE VIRTUAL TABLE variables USING fts5(id, name, type, shape, bytes, "
        "num_tiles, constant, always_live)", "PRAGMA writable_schema=ON",
        "UPDATE sqlite_master SET sql=replace(sql, 'CREATE VIRTUAL TABLE', 'CREATE /* a plain */ VIRTUAL TABLE') "
        "WHERE name='variables'"), "CorruptReport", "virtual table 'variables'"),
    "expression index": (_sql("CREATE INDEX i ON steps(abs(idx) + length(name))"), "CorruptReport", "index 'i'"),
    "generated column": (_sql(
        "CREATE TABLE runs2 (id INTEGER PRIMARY KEY, program INTEGER, name TEXT AS (hex(zeroblob(400000000))), "
        "host_seconds REAL, dry INTEGER)", "INSERT INTO runs2 (id, program, host_seconds, dry) "
        "SELECT id, program, host_seconds, dry FROM runs", "DROP TABLE runs", "ALTER TABLE runs2 RENAME TO runs"),
        "CorruptReport", "generated column"),
    "missing table": (_sql("DROP TABLE programs"), "CorruptReport", "programs missing"),
    "missing meta table": (_sql("DROP TABLE meta"), "NotAReport", "no meta table"),
    "missing column": (_sql("ALTER TABLE steps DROP COLUMN tile_cycles"), "CorruptReport",
                       "'steps' lacks column.*tile_cycles"),
    "wrong column type (text parent)": (_sql("UPDATE programs SET parent='x' WHERE id=1"), "CorruptReport",
                                        "programs.parent holds str"),
    "wrong column type (blob count)": (_sql("UPDATE compute_set_vertices SET count=x'00'"), "CorruptReport",
                                       "compute_set_vertices.count holds bytes"),
    "wrong column type (blob meta value)": (_sql("UPDATE meta SET value=x'31' WHERE key='format_version'"),
                                            "CorruptReport", "meta.value holds bytes"),
    "variable shape not numbers": (_sql("UPDATE variables SET shape='1,2,x' WHERE id=(SELECT min(id) FROM variables)"),
                                   "CorruptReport", "shape"),
    "variable shape of 5000 digits": (_sql("UPDATE variables SET shape='" + "9" * 5000 + "'"), "CorruptReport",
                                      "shape"),
    "truncated file": (_bytes(lambda d: d[:len(d) // 2]), "CorruptReport", "truncated"),
    "truncated header": (_bytes(lambda d: d[:60]), "CorruptReport", "truncated"),
    "random bytes": (_bytes(lambda d: _RNG_BYTES), "NotAReport", "not a profile"),
    "SQLite header then random bytes": (_bytes(lambda d: d[:100] + _RNG_BYTES), "CorruptReport", ""),
    "zero bytes": (_bytes(lambda d: b""), "NotAReport", "not a profile"),
    "object-dtype npy": (_set_array("memory/total", _npy(np.array([{"a": 1}] * 4, dtype=object), True)),
                         "CorruptReport", "'memory/total'.*not a plain number"),
    "npy header claiming 10**12 elements": (_set_array(
        "memory/total", _npy_header("{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000,), }",
                                    b"\0" * 64)), "CorruptReport", "over the limit"),
    "npy shape bigger than its payload": (_set_array(
        "memory/total", _npy_header("{'descr': '<i8', 'fortran_order': False, 'shape': (100000,), }", b"\0" * 64)),
        "CorruptReport", "BLOB holds 64"),
    "npy header nested 2000 deep": (_set_array(
        "memory/total", _npy_header("(" * 2000 + ")" * 2000)), "CorruptReport", "header"),
    "npy structured dtype": (_set_array("memory/total", _npy(np.zeros(3, dtype=[("a", "<i8")]))),
                             "CorruptReport", "not a plain number"),
    "pickle BLOB": (_set_array("memory/total", pickle.dumps(["os", "system"])), "CorruptReport",
                    "not a .npy array"),
    "array of the wrong shape": (_set_array("memory/total", _npy(np.zeros(10, np.int64))), "CorruptReport",
                                 "expected \\[1472\\]"),
    "missing array": (_sql("DELETE FROM arrays WHERE name='steps/cycles/sync'"), "CorruptReport",
                      "lacks the array 'steps/cycles/sync'"),
    "NaN cycles": (_set_array("runs/0/cyclesPerIpu", _npy(np.array([np.nan]))), "CorruptReport", "NaN"),
    "huge numTiles": (_sql("UPDATE target SET value=1000000000000 WHERE key='numTiles'"), "CorruptReport",
                      "target.numTiles"),
    "huge numIPUs": (_sql("UPDATE target SET value=9223372036854775807 WHERE key='numIPUs'"), "CorruptReport",
                     "target.numIPUs"),
    "zero tilesPerIPU": (_sql("UPDATE target SET value=0 WHERE key='tilesPerIPU'"), "CorruptReport",
                         "target.tilesPerIPU"),
    "zero bytesPerTile": (_sql("UPDATE target SET value=0 WHERE key='bytesPerTile'"), "CorruptReport",
                          "target.bytesPerTile"),
    "NaN clock": (_sql("UPDATE target SET value='nan' WHERE key='clockHz'"), "CorruptReport", "clockHz"),
    "huge repeat count (harmless)": (_sql("UPDATE programs SET repeat_count=9223372036854775807 WHERE id=0"),
                                     "ok", ""),
    "huge graph count (harmless)": (_sql("UPDATE graph SET value=9223372036854775807 WHERE key='numVertices'"),
                                    "ok", ""),
    "trace names a step that does not exist": (_set_array(
        "runs/0/trace/step", _npy(np.array([0, 10 ** 9], np.int32))), "CorruptReport", "trace"),
    "program tree with a cycle": (_sql("UPDATE programs SET parent=(SELECT max(id) FROM programs) WHERE id=1"),
                                  "CorruptReport", "program 1 has parent"),
    "program runs a step that does not exist": (_sql(
        "UPDATE programs SET step=100000 WHERE id=(SELECT min(id) FROM programs WHERE step IS NOT NULL)"),
        "CorruptReport", "runs step 100000"),
    "step names a missing compute set": (_sql(
        "UPDATE steps SET compute_set=424242 WHERE idx=(SELECT min(idx) FROM steps WHERE compute_set IS NOT NULL)"),
        "CorruptReport", "compute set 424242"),
    "deep program tree (valid)": (_deep_tree, "ok", ""),
    "newer format version": (_sql("UPDATE meta SET value='2' WHERE key='format_version'"), "UnsupportedFormat",
                             "newer format version 2"),
    "older format version": (_sql("UPDATE meta SET value='0' WHERE key='format_version'"), "UnsupportedFormat",
                             "older format version 0"),
    "format version of 5000 digits": (_sql("UPDATE meta SET value='" + "9" * 5000 + "' WHERE key='format_version'"),
                                      "CorruptReport", "unreadable format version"),
    "another magic": (_sql("UPDATE meta SET value='x' WHERE key='magic'"), "NotAReport", "magic"),
    "WAL-mode file (no -wal/-shm may appear)": (_sql("PRAGMA journal_mode=WAL"), "ok", ""),
    "hot journal beside the file is ignored": (None, "ok", ""),
}


def _make_case(root, k, name, apply, good):
    d = root / f"case{k}"
    d.mkdir()
    p = d / "profile.pop"
    p.write_bytes(good)
    if apply is not None:
        apply(str(p))
    for extra in ("-wal", "-shm", "-journal"):
        if os.path.exists(str(p) + extra) and "hot journal" not in name:
            os.remove(str(p) + extra)
    if "hot journal" in name:           # a rollback journal that, if replayed, would rewrite the file
        (d / "profile.pop-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\0" * 4088)
    return str(p)


def _listing(*dirs):
    return {str(d): sorted(os.listdir(d)) for d in dirs}


@pytest.fixture(scope="module")
def crafted_results(good, tmp_path_factory):
    root = tmp_path_factory.mktemp("untrusted-cases")
    cwd = tmp_path_factory.mktemp("untrusted-cwd")
    cases = [{"name": n, "path": _make_case(root, k, n, apply, good)}
             for k, (n, (apply, _, _)) in enumerate(CASES.items())]
    fifo = root / "fifo"
    fifo.mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(fifo / "profile.pop")
        cases.append({"name": "FIFO instead of a file", "path": str(fifo / "profile.pop")})
    dirs = [cwd] + [os.path.dirname(c["path"]) for c in cases]
    before = _listing(*dirs)
    results = _run_child(cases, str(cwd))
    return results, before, _listing(*dirs)


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_profile(crafted_results, name):
    results, before, after = crafted_results
    r = results[name]
    _, expected, pattern = CASES[name]
    assert r["result"] != "other", r.get("traceback", r)
    assert r["result"] == expected, r
    if pattern:
        import re
        assert re.search(pattern, r["message"]), r["message"]
        assert "\n" not in r["message"]
    assert before == after, "a file was created or removed"


def test_fifo_is_not_read(crafted_results):
    results, before, after = crafted_results
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    assert results["FIFO instead of a file"]["result"] == "NotAReport"
    assert "not a regular file" in results["FIFO instead of a file"]["message"]


def test_all_pva_errors_are_pva_error():
    for cls in (pva.NotAReport, pva.UnsupportedFormat, pva.CorruptReport):
        assert issubclass(cls, pva.Error)


def test_connection_cannot_write_attach_or_vacuum(good, tmp_path):
    """The reader's connection is read-only: no statement can create or change a file (a crafted
    file cannot make the reader run these, and even the reader's own connection refuses them)."""
    from openipu.popvision import reader
    d = tmp_path / "canary"
    d.mkdir()
    p = d / "profile.pop"
    p.write_bytes(good)
    con = reader.open_connection(str(p))
    try:
        for sql in (f"VACUUM INTO '{d / 'copy.db'}'", f"ATTACH DATABASE '{d / 'new.db'}' AS x",
                    "CREATE TABLE t (x)", "DELETE FROM runs", "PRAGMA journal_mode=WAL",
                    "PRAGMA writable_schema=ON", "SELECT load_extension('x')", "SELECT writefile('x', 'y')"):
            with pytest.raises(pva.CorruptReport):
                con.query(sql, "a test statement")
        assert con.query("SELECT count(*) FROM runs", "runs") == [(1,)]
    finally:
        con.close()
    assert sorted(os.listdir(d)) == ["profile.pop"]
    assert p.read_bytes() == good


def test_query_time_is_bounded(good, tmp_path):
    """A query that never ends is interrupted by the progress handler (QUERY_TIME_LIMIT_SECONDS,
    lowered here) with CorruptReport; the child's timeout only guards against a regression."""
    p = tmp_path / "profile.pop"
    p.write_bytes(good)
    cross = "SELECT count(*) FROM " + ", ".join(f"arrays a{k}" for k in range(10))     # ~30**10 rows
    r = _run_child([{"name": "endless", "path": str(p), "query_limit": 0.5, "sql": cross},
                    {"name": "recursive", "path": str(p), "sql": f"{_RECURSIVE} SELECT count(*) FROM r"}],
                   str(tmp_path))
    assert r["endless"]["result"] == "CorruptReport" and "took over 0.5 s" in r["endless"]["message"], r
    # the connection's authorizer refuses recursive queries outright
    assert r["recursive"]["result"] == "CorruptReport" and "not authorized" in r["recursive"]["message"], r


def _mutants(good, n, seed=20261129):
    """``n`` seeded byte mutations of the good profile: 1 to 16 random bytes overwritten, half of
    them in the first 16 KiB (SQLite header, schema and table b-tree pages), half anywhere."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        data = bytearray(good)
        span = min(len(data), 16384) if k % 2 == 0 else len(data)
        for _ in range(int(rng.integers(1, 17))):
            data[int(rng.integers(0, span))] = int(rng.integers(0, 256))
        out.append(bytes(data))
    return out


def test_byte_mutations(good, tmp_path):
    n = int(os.environ.get("PVA_FUZZ_CASES", "40"))
    cases = []
    for k, data in enumerate(_mutants(good, n)):
        d = tmp_path / f"m{k}"
        d.mkdir()
        (d / "profile.pop").write_bytes(data)
        cases.append({"name": f"mutant {k}", "path": str(d / "profile.pop")})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = _listing(cwd, *(os.path.dirname(c["path"]) for c in cases))
    results = _run_child(cases, str(cwd))
    after = _listing(cwd, *(os.path.dirname(c["path"]) for c in cases))
    bad = {k: v for k, v in results.items() if v["result"] == "other"}
    assert not bad, next(iter(bad.values())).get("traceback")
    assert before == after
    outcomes = sorted(v["result"] for v in results.values())
    assert set(outcomes) <= {"ok", "CorruptReport", "NotAReport", "UnsupportedFormat"}, outcomes
    assert "CorruptReport" in outcomes      # the mutations do reach SQLite's and the reader's checks


_ODD_VALUES = (None, -1, 0, 1, 7, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 0.5, 1e308, float("inf"), "", "x", "9" * 40,
               "1,2", "-1", b"", b"\x00", b"\x93NUMPY")


def _value_mutant(path, rng):
    """Overwrite one cell of a random table with an odd value (or an array with an odd array)."""
    con = sqlite3.connect(path)
    tables = ["meta", "target", "graph", "memory_categories", "variables", "vertex_types", "compute_sets",
              "compute_set_vertices", "steps", "programs", "runs", "arrays"]
    while True:
        t = tables[int(rng.integers(len(tables)))]
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
        rowids = [r[0] for r in con.execute(f"SELECT rowid FROM {t}")]
        if not rowids:
            continue
        col = cols[int(rng.integers(len(cols)))]
        rowid = rowids[int(rng.integers(len(rowids)))]
        if t == "arrays" and col == "data" and rng.random() < 0.7:
            kind = rng.choice(["<i8", "<f8", "<i4", "|u1", "<f4"])
            shape = tuple(int(x) for x in rng.integers(0, 4000, int(rng.integers(0, 3))))
            fill = rng.choice([0.0, 1.0, -1.0, np.inf, np.nan]) if "f" in kind else rng.choice([0, 1, 100])
            value = _npy(np.full(shape, fill, dtype=kind))
        else:
            value = _ODD_VALUES[int(rng.integers(len(_ODD_VALUES)))]
        try:
            con.execute(f"UPDATE {t} SET {col}=? WHERE rowid=?", (value, rowid))
        except sqlite3.Error:          # e.g. text into an INTEGER PRIMARY KEY: try another cell
            continue
        con.commit()
        con.close()
        return f"{t}.{col} row {rowid} = {value[:20] if isinstance(value, (str, bytes)) else value!r}"


def test_value_mutations(good, tmp_path):
    """Seeded single-cell changes (odd values in any column, odd arrays): each opens and walks
    cleanly or raises a pva.Error, and creates no file."""
    rng = np.random.default_rng(20261130)
    n = int(os.environ.get("PVA_FUZZ_CASES", "40"))
    cases, what = [], {}
    for k in range(n):
        d = tmp_path / f"v{k}"
        d.mkdir()
        (d / "profile.pop").write_bytes(good)
        what[f"value mutant {k}"] = _value_mutant(str(d / "profile.pop"), rng)
        cases.append({"name": f"value mutant {k}", "path": str(d / "profile.pop")})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    dirs = [cwd, *(os.path.dirname(c["path"]) for c in cases)]
    before = _listing(*dirs)
    results = _run_child(cases, str(cwd))
    assert before == _listing(*dirs)
    bad = {k: v for k, v in results.items() if v["result"] == "other"}
    assert not bad, [(what[k], v["traceback"]) for k, v in bad.items()][0]
    assert "CorruptReport" in {v["result"] for v in results.values()}


# ------------------------------------------------------------------------------------------------
# openipu report: no partial page
# ------------------------------------------------------------------------------------------------
def test_failed_report_leaves_no_html(good, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "profile.pop").write_bytes(good)
    _sql("UPDATE target SET value=0 WHERE key='tilesPerIPU'")(str(bad / "profile.pop"))
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "profile.pop").write_bytes(good)
    out = tmp_path / "out"
    out.mkdir()
    # a bad profile, a bad compare profile: exit 1, one line on stderr, no page, no temporary file
    for argv in (["report", str(bad), "-o", str(out / "a.html")],
                 ["report", str(ok), "-o", str(out / "a.html"), "--compare", str(bad)],
                 ["report", str(bad)]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "CorruptReport" in err and "Traceback" not in err, err
        assert sorted(os.listdir(out)) == [] and sorted(os.listdir(bad)) == ["profile.pop"]
    # an error while the page is rendered keeps the previous page whole and leaves no temporary file
    from openipu.popvision import html
    assert cli.main(["report", str(ok), "-o", str(out / "a.html")]) == 0
    capsys.readouterr()
    page = (out / "a.html").read_bytes()
    assert len(page) > 1000

    def broken(*_a, **_k):
        raise pva.CorruptReport("damaged while rendering")
    real = html.render
    html.render = broken
    try:
        assert cli.main(["report", str(ok), "-o", str(out / "a.html")]) == 1
    finally:
        html.render = real
    assert "damaged while rendering" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["a.html"] and (out / "a.html").read_bytes() == page
    # an output directory that does not exist: one line, exit 1
    assert cli.main(["report", str(ok), "-o", str(tmp_path / "nowhere" / "x.html")]) == 1
    assert "FileNotFoundError" in capsys.readouterr().err


def test_report_file_permissions_follow_umask(good, tmp_path):
    from openipu.popvision.html import write_report
    (tmp_path / "profile.pop").write_bytes(good)
    old = os.umask(0o022)
    try:
        out = write_report(str(tmp_path), str(tmp_path / "r.html"))
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tmp_path)) == ["profile.pop", "r.html"]


def test_good_profile_arrays_are_writable(good, tmp_path):
    (tmp_path / "profile.pop").write_bytes(good)
    r = pva.openReport(str(tmp_path))
    r.compilation.memoryByTile[0] += 0          # numpy arrays as before (not read-only views)
    assert shutil.disk_usage(tmp_path) and sorted(os.listdir(tmp_path)) == ["profile.pop"]
