"""The executable file (``openipu.poplar.exefile`` and the Poplar graph records of
``openipu.poplar.graph_codec``): round trips, and crafted files that try to run code, write files,
exhaust memory or crash the loader. Every crafted file here has its hashes recomputed, as an
attacker's would."""

import hashlib
import io
import json
import os
import zipfile
import zlib

import numpy as np
import pytest
import torch

import codelets_for_tests as C
from openipu import poplar
from openipu.poplar import exefile, graph_codec
from openipu.poplar import program as P
from openipu.poplar.types import QUARTER_F152


def _graph(tiles=2):
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    device = m.createDevice()
    g = poplar.Graph(device.getTarget())
    g.addCodelets(C)
    return device, g


def _exe(tmp_path):
    device, g = _graph()
    n = g.addVariable(poplar.INT, [], "n")
    g.setTileMapping(n, 0)
    g.createHostRead("n", n)
    cs = g.addComputeSet("incr")
    v = g.addVertex(cs, "Incr", {"x": n}, tile=0)
    g.setPerfEstimate(v, 10)
    exe = poplar.compileGraph(g, [P.Repeat(5, P.Execute(cs))])
    path = tmp_path / "exe.bin"
    exe.serialize(str(path))
    return device, path


def _members(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i.filename) for i in z.infolist()}


def _write(path, members: dict, fix_hashes=True, compress=()):
    """Write ``members`` as a zip; with ``fix_hashes``, the manifest lists every member with its
    true size and SHA-256 (what a crafted file would do)."""
    members = dict(members)
    if fix_hashes:
        man = json.loads(members["manifest.json"])
        man["members"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                          for n, b in members.items() if n != "manifest.json"}
        members["manifest.json"] = json.dumps(man).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b, compress_type=zipfile.ZIP_DEFLATED if n in compress or n.endswith(".json")
                       else zipfile.ZIP_STORED)


def _with_records(tmp_path, records, root=None, extra=None):
    """A Poplar executable whose records are replaced by ``records``."""
    _, good = _exe(tmp_path)
    m = _members(good)
    m["records.json"] = json.dumps({"root": root if root is not None else {"r": 0}, "records": records}).encode()
    m.update(extra or {})
    path = tmp_path / "crafted.bin"
    _write(path, m)
    return path


# -- round trips ------------------------------------------------------------------------------------
def test_roundtrip_runs_and_holds_only_data(tmp_path):
    device, path = _exe(tmp_path)
    m = _members(path)
    man = json.loads(m["manifest.json"])
    assert man["format"] == "openipu-executable" and man["version"] == exefile.VERSION == 2
    assert man["kind"] == "poplar.Executable"
    assert set(m) == {"manifest.json", "records.json", "arrays.json", *[f"arrays-{k}.npy" for k in
                                                                       range(json.loads(m["arrays.json"])["groups"])]}
    blob = b"".join(m.values())
    assert b"\x80\x04" not in blob and b"pickle" not in blob
    # no record names a module: records are of the codec's kinds, classes by registry key
    kinds = {r["t"] for r in json.loads(m["records.json"])["records"]}
    assert kinds <= {"list", "tuple", "dict", "set", "frozenset", "float", "bigint", "slice", "range", "nd", "nps",
                     "dtype", "tdtype", "tt", "bytes", "bytearray", "ptype", "enum", "kernel", "codelet", "obj"}
    e = poplar.Engine(poplar.Executable.deserialize(str(path)))
    e.load(device)
    e.run()
    assert e.readTensor("n") == 5


def test_library_graph_roundtrip_gives_the_same_results_and_prediction():
    from openipu.poplibs import poplin, popops
    device, g = _graph(tiles=16)
    a = poplin.createMatMulInputLHS(g, poplar.FLOAT, [8, 12], [12, 6], "a")
    b = poplin.createMatMulInputRHS(g, poplar.FLOAT, [8, 12], [12, 6], "b")
    prog = P.Sequence()
    c = poplin.matMul(g, a, b, prog, poplar.FLOAT)
    r = popops.reduce(g, c, poplar.FLOAT, [0], popops.Operation.ADD, prog)
    for t, name in ((a, "a"), (b, "b")):
        g.createHostWrite(name, t)
    g.createHostRead("r", r)
    exe = poplar.compileGraph(g, [prog])
    buf = io.BytesIO()
    exe.serialize(buf)
    buf.seek(0)
    back = poplar.Executable.deserialize(buf)
    rng = np.random.default_rng(0)
    av, bv = rng.standard_normal((8, 12), np.float32), rng.standard_normal((12, 6), np.float32)
    outs, cycles = [], []
    for x in (exe, back):
        e = poplar.Engine(x)
        e.load(device)
        e.writeTensor("a", av)
        e.writeTensor("b", bv)
        e.run(0)
        outs.append(e.readTensor("r"))
        cycles.append(e.last_run_cycles)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], (av @ bv).sum(0), rtol=1e-5)
    assert cycles[0] == cycles[1]


def test_values_roundtrip_keeps_sharing_and_types():
    shared = np.arange(6, dtype=np.int32).reshape(2, 3)
    cyc = []
    cyc.append(cyc)
    obj = {"a": shared, "b": shared, "t": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "f": float("nan"),
           "big": 2 ** 70, "s": {1, 2}, "fs": frozenset({"x"}), "tup": (1, "two", None), "dt": np.dtype("<f2"),
           "tdt": torch.float16, "cyc": cyc, "bytes": b"\x00\x01", "type": poplar.FLOAT, "sl": slice(1, None, 2),
           "np": np.float16(3.5), "q": QUARTER_F152}
    buf = io.BytesIO(exefile.dumps("test", graph_codec.to_members(obj)))
    back = graph_codec.from_contents(exefile.read(buf, "test"))
    assert back["a"] is back["b"] and back["a"].dtype == np.int32 and (back["a"] == shared).all()
    assert back["t"].dtype == torch.bfloat16 and back["t"].tolist() == [1.5, -2.0]
    assert np.isnan(back["f"]) and back["big"] == 2 ** 70 and back["s"] == {1, 2} and back["fs"] == frozenset({"x"})
    assert back["tup"] == (1, "two", None) and back["dt"] == np.float16 and back["tdt"] is torch.float16
    assert back["cyc"][0] is back["cyc"] and back["bytes"] == b"\x00\x01" and back["type"] is poplar.FLOAT
    assert back["sl"] == slice(1, None, 2) and back["np"] == np.float16(3.5) and back["q"] is QUARTER_F152


def test_unsaveable_objects_raise_poplar_errors():
    with pytest.raises(poplar.poplar_error, match="not a record kind"):
        graph_codec.to_members({"k": lambda x: x})
    with pytest.raises(poplar.poplar_error, match="not a registered vertex kernel"):
        import functools
        graph_codec.to_members(functools.partial(print, "x"))

    class Local:
        pass
    with pytest.raises(poplar.poplar_error):
        graph_codec.to_members(Local())
    with pytest.raises(poplar.poplar_error, match="not a record kind"):
        graph_codec.to_members(os)


def test_every_poplibs_kernel_is_registered():
    # every function a PopLibs module binds into a vertex group (functools.partial(fn, ...), a
    # VertexGroup's kernel, a Collective) is in the kernel registry, so its graphs can be saved
    import ast
    import importlib
    import pathlib

    import openipu
    root = pathlib.Path(openipu.__file__).parent
    missing = []
    for f in [*sorted((root / "poplibs").rglob("*.py")), root / "poplar" / "quarter.py"]:
        mod = importlib.import_module("openipu." + ".".join(f.relative_to(root).with_suffix("").parts))
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            cands = []
            if name == "partial" and node.args:
                cands.append(node.args[0])
            if name == "VertexGroup" and len(node.args) >= 4:
                cands.append(node.args[3])
            if name == "Collective" and node.args:
                cands.append(node.args[0])
            for c in cands:
                fn = getattr(mod, c.id, None) if isinstance(c, ast.Name) else None
                if callable(fn) and fn is not graph_codec.kernel and not graph_codec.kernel_registered(fn):
                    missing.append(f"{mod.__name__}.{c.id}")
    assert not missing


# -- damaged files -----------------------------------------------------------------------------------
def test_truncated_corrupt_tampered_and_wrong_version_files(tmp_path):
    _, path = _exe(tmp_path)
    good = path.read_bytes()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(exefile.executable_file_error, match="truncated or corrupt"):
        poplar.Executable.deserialize(str(bad))
    bad.write_bytes(b"not a zip at all")
    with pytest.raises(poplar.poplar_error, match="not an openipu executable"):
        poplar.Executable.deserialize(str(bad))
    with pytest.raises(poplar.poplar_error, match="No executable file"):
        poplar.Executable.deserialize(str(tmp_path / "missing.bin"))
    # one byte changed in the records, hashes not fixed: the hash check catches it
    m = _members(path)
    m["records.json"] = m["records.json"].replace(b'"n"', b'"m"', 1)
    _write(bad, m, fix_hashes=False)
    with pytest.raises(exefile.executable_file_error, match="SHA-256"):
        poplar.Executable.deserialize(str(bad))
    # version 1 (the old object-graph format) and a future version: refused, compile again
    for v in (1, exefile.VERSION + 1):
        m = _members(path)
        man = json.loads(m["manifest.json"])
        man["version"] = v
        m["manifest.json"] = json.dumps(man).encode()
        _write(bad, m)
        with pytest.raises(exefile.executable_file_error, match="Compile the model again"):
            poplar.Executable.deserialize(str(bad))
    bad.write_bytes(exefile.dumps("poprt.Executable", {"x.json": [1]}))
    with pytest.raises(exefile.executable_file_error, match="not a poplar.Executable"):
        poplar.Executable.deserialize(str(bad))


# -- crafted records -------------------------------------------------------------------------------
CANARY = "openipu-canary-{}"


@pytest.mark.parametrize("records", [
    # the old format's gadgets: a constructor record calling a named function
    [{"t": "obj", "f": {"r": 1}, "a": {"r": 2}}, {"t": "name", "m": "os", "q": "system"},
     {"t": "list", "v": ["touch CANARY"]}],
    # an unregistered class, a module, a builtin, an openipu function that is not a kernel
    [{"t": "obj", "c": "os:system", "f": {}}],
    [{"t": "obj", "c": "builtins:eval", "f": {}}],
    [{"t": "kernel", "f": "poplar.exefile:write", "a": ["CANARY", "x", {}], "k": {}}],
    [{"t": "kernel", "f": "builtins:exec", "a": ["open('CANARY', 'w')"], "k": {}}],
    [{"t": "kernel", "f": "poplar.graph:_collect_codelets", "a": ["CANARY.py"], "k": {}}],
    [{"t": "enum", "c": "os:PathLike", "v": "x"}],
    [{"t": "codelet", "v": "NoSuchCodelet"}],
    # a registered class with fields it does not declare (dunder state, a method to call)
    [{"t": "obj", "c": "poplar.graph:Graph", "f": {"__class__": "x"}}],
    [{"t": "obj", "c": "poplar.graph:Graph", "f": {"__reduce__": "x"}}],
    [{"t": "obj", "c": "poplar.graph:Graph", "f": {"_state": 5}}],
    # references out of range, self-referencing immutable values, unknown kinds
    [{"t": "list", "v": [{"r": 99}]}],
    [{"t": "tuple", "v": [{"r": 0}]}],
    [{"t": "name", "m": "builtins", "q": "eval"}],
    [{"t": "partial", "f": {"r": 1}, "a": [], "k": {}}, {"t": "name", "m": "os", "q": "system"}],
    [{"t": "method", "self": {"r": 1}, "name": "write"}, {"t": "list", "v": []}],
    [{"t": "dtype", "v": "O"}], [{"t": "tdtype", "v": "load"}], [{"t": "ptype", "v": "__class__"}],
    [{"t": "bigint", "v": "9" * 5000}], [{"t": "float", "v": "1e999999"}],
    [{"t": "kernel", "f": "poplibs.popops.elementwise:_map_kernel", "a": [], "k": {"__import__": 1}}],
], ids=lambda r: str(r)[:60])
def test_crafted_records_run_nothing_and_raise_the_poplar_error(tmp_path, monkeypatch, records):
    monkeypatch.chdir(tmp_path)
    canary = tmp_path / "CANARY"
    records = json.loads(json.dumps(records).replace("CANARY", str(canary)))
    path = _with_records(tmp_path, records)
    before = set(os.listdir(tmp_path))
    with pytest.raises(poplar.poplar_error) as e:
        poplar.Executable.deserialize(str(path))
    assert len(str(e.value).splitlines()) == 1
    assert not canary.exists() and set(os.listdir(tmp_path)) == before


def test_deep_nesting_and_nan_tokens_are_refused(tmp_path):
    _, good = _exe(tmp_path)
    for text in (b"[" * 200_000 + b"]" * 200_000, b'{"root": NaN, "records": []}', b'{"root": Infinity}'):
        m = _members(good)
        m["records.json"] = text
        path = tmp_path / "c.bin"
        _write(path, m)
        with pytest.raises(exefile.executable_file_error):
            poplar.Executable.deserialize(str(path))


# -- crafted containers ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../evil.json", "/abs.npy", "a/b.npy", "..", "x\\y.npy", ".hidden"])
def test_member_names_with_paths_are_refused(tmp_path, name):
    _, good = _exe(tmp_path)
    m = _members(good)
    m[name] = b"{}"
    path = tmp_path / "c.bin"
    _write(path, m)
    with pytest.raises(exefile.executable_file_error, match="member name|manifest"):
        poplar.Executable.deserialize(str(path))
    assert not (tmp_path.parent / "evil.json").exists()


def test_duplicate_extra_and_missing_members_are_refused(tmp_path):
    _, good = _exe(tmp_path)
    m = _members(good)
    path = tmp_path / "c.bin"
    # a duplicate member: zipfile reads the last one, the hash of the first is in the manifest
    _write(path, m)
    with zipfile.ZipFile(path, "a") as z:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z.writestr("records.json", b'{"root": 1, "records": []}')
    with pytest.raises(exefile.executable_file_error, match="repeated member"):
        poplar.Executable.deserialize(str(path))
    # an extra member the manifest does not list
    man = json.loads(m["manifest.json"])
    _write(path, {**m, "extra.npy": b"x"}, fix_hashes=False)
    with pytest.raises(exefile.executable_file_error, match="manifest's members"):
        poplar.Executable.deserialize(str(path))
    del m["records.json"]
    _write(path, {**m, "manifest.json": json.dumps(man).encode()}, fix_hashes=False)
    with pytest.raises(exefile.executable_file_error, match="manifest's members"):
        poplar.Executable.deserialize(str(path))


def _raw_zip(entries) -> bytes:
    """A zip built byte by byte: ``entries`` of (name, compress type, raw payload, CRC, size the
    headers claim), so a test can make headers lie as a crafted file's would."""
    import struct
    out, cd = io.BytesIO(), []
    for name, ctype, payload, crc, usize in entries:
        off, fname = out.tell(), name.encode()
        out.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, ctype, 0, 0, crc, len(payload), usize,
                              len(fname), 0) + fname + payload)
        cd.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, ctype, 0, 0, crc, len(payload), usize,
                              len(fname), 0, 0, 0, 0, 0, off) + fname)
    start = out.tell()
    out.write(b"".join(cd))
    out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(cd), len(cd), out.tell() - start, start, 0))
    return out.getvalue()


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path):
    # 1 GiB of zeros deflates to ~1 MB. As an array member (only JSON may be compressed) it is
    # refused unread; as a JSON member its size is over the bound; with headers that claim 100
    # bytes, reading stops after 100 bytes.
    _, good = _exe(tmp_path)
    m = _members(good)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = b"".join(comp.compress(b"\0" * (64 << 20)) for _ in range(16)) + comp.flush()
    assert len(bomb) < 2 << 20
    for name, claimed in (("arrays-0.npy", 1 << 30), ("records.json", 1 << 30), ("records.json", 100)):
        man = json.loads(m["manifest.json"])
        man["members"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                          for n, b in m.items() if n != "manifest.json"}
        man["members"][name] = {"sha256": "0" * 64, "size": claimed}
        entries = [("manifest.json", 0, json.dumps(man).encode(), zlib.crc32(json.dumps(man).encode()),
                    len(json.dumps(man).encode()))]
        for n, b in m.items():
            if n == "manifest.json":
                continue
            entries.append((n, 8, bomb, 0, claimed) if n == name else (n, 0, b, zlib.crc32(b), len(b)))
        path = tmp_path / "bomb.bin"
        path.write_bytes(_raw_zip(entries))
        import resource
        import time
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        with pytest.raises(exefile.executable_file_error):
            poplar.Executable.deserialize(str(path))
        assert time.perf_counter() - t0 < 30      # a hang guard only
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 200_000   # KiB: never inflated


def test_array_headers_are_checked_before_allocation(tmp_path):
    _, good = _exe(tmp_path)
    path = tmp_path / "c.bin"
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000, 1000000), }"
    huge = b"\x93NUMPY\x01\x00" + len(hdr.ljust(118)).to_bytes(2, "little") + hdr.ljust(117).encode() + b"\n"
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for payload, msg in ((huge, "does not match"), (obj.getvalue(), "not a plain|not a valid"),
                         (b"\x80\x04\x95" + b"pickle" * 10, "not a valid"), (b"\x93NUMPY\x09\x00", "not a valid")):
        m = _members(good)
        m["arrays-0.npy"] = payload
        _write(path, m)
        with pytest.raises(exefile.executable_file_error, match=msg):
            poplar.Executable.deserialize(str(path))


def test_size_bounds(tmp_path, monkeypatch):
    _, good = _exe(tmp_path)
    total = sum(i.file_size for i in zipfile.ZipFile(good).infolist() if i.filename != "manifest.json")
    with pytest.raises(exefile.executable_file_error, match="bound on executables"):
        exefile.read(str(good), max_bytes=total - 1)
    assert exefile.read(str(good), max_bytes=total).kind == "poplar.Executable"
    monkeypatch.setenv("OPENIPU_EXECUTABLE_MAX_BYTES", str(total - 1))
    with pytest.raises(exefile.executable_file_error, match="bound on executables"):
        poplar.Executable.deserialize(str(good))
    monkeypatch.setenv("OPENIPU_EXECUTABLE_MAX_BYTES", "lots")
    with pytest.raises(exefile.executable_file_error, match="positive integer"):
        poplar.Executable.deserialize(str(good))
    # a manifest whose declared size disagrees with the zip's
    monkeypatch.delenv("OPENIPU_EXECUTABLE_MAX_BYTES")
    m = _members(good)
    man = json.loads(m["manifest.json"])
    man["members"]["records.json"]["size"] += 1
    _write(tmp_path / "c.bin", {**m, "manifest.json": json.dumps(man).encode()}, fix_hashes=False)
    with pytest.raises(exefile.executable_file_error, match="manifest says"):
        poplar.Executable.deserialize(str(tmp_path / "c.bin"))


def test_codelets_come_from_the_loading_process(tmp_path):
    device, path = _exe(tmp_path)
    saved = dict(graph_codec.LOADED_CODELETS)
    try:
        graph_codec.LOADED_CODELETS.pop("Incr")
        with pytest.raises(exefile.executable_file_error, match="codelet 'Incr'.*addCodelets"):
            poplar.Executable.deserialize(str(path))
    finally:
        graph_codec.LOADED_CODELETS.update(saved)


def test_moved_record_kinds_keep_the_names_files_hold():
    """Kinds moved out of poplar/graph.py and popops/reduce.py when those were split are named in
    files as before, so an executable saved before the split still loads."""
    from openipu.poplar import graph_codec
    from openipu.poplar.address_space import AddressSpace, Variable
    from openipu.poplar.graph_objects import Access, ComputeSet, VertexGroup
    from openipu.poplibs.popops.reduce import Operation
    names = {c: graph_codec._CLASS_KEY[c] for c in (AddressSpace, Variable, Access, ComputeSet, VertexGroup, Operation)}
    assert names == {AddressSpace: "poplar.graph:_Space", Variable: "poplar.graph:Variable",
                     Access: "poplar.graph:Access", ComputeSet: "poplar.graph:ComputeSet",
                     VertexGroup: "poplar.graph:VertexGroup", Operation: "poplibs.popops.reduce:Operation"}
