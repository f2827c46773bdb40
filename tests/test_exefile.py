"""The executable file format (``openipu.poplar.exefile``): round trips, and every way a file can be bad."""

import functools
import io
import json
import os
import zipfile

import numpy as np
import pytest
import torch

import codelets_for_tests as C
from openipu import poplar
from openipu.poplar import exefile
from openipu.poplar import program as P


def _exe(tmp_path):
    dev = poplar.IPUModel("ipu2")
    dev.tilesPerIPU = 2
    device = dev.createDevice()
    g = poplar.Graph(device.getTarget())
    g.addCodelets(C)
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


def test_roundtrip_runs_and_holds_no_pickle(tmp_path):
    device, path = _exe(tmp_path)
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        man = json.loads(z.read("manifest.json"))
        blob = z.read("objects.json") + z.read("arrays.bin")
    assert names == {"manifest.json", "objects.json", "arrays.index.json", "arrays.bin"}
    assert man["format"] == "openipu-executable" and man["version"] == exefile.VERSION
    assert man["kind"] == "poplar.Executable"
    assert b"\x80\x04" not in blob[:2] and b"pickle" not in blob
    e = poplar.Engine(poplar.Executable.deserialize(str(path)))
    e.load(device)
    e.run()
    assert e.readTensor("n") == 5


def test_object_graph_roundtrip_keeps_sharing_types_and_arrays():
    shared = np.arange(6, dtype=np.int32).reshape(2, 3)
    cyc = []
    cyc.append(cyc)
    obj = {"a": shared, "b": shared, "t": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "f": float("nan"),
           "big": 2 ** 70, "s": {1, 2}, "fs": frozenset({"x"}), "tup": (1, "two", None), "dt": np.dtype("<f2"),
           "tdt": torch.float16, "cyc": cyc, "bytes": b"\x00\x01", "type": poplar.FLOAT, "sl": slice(1, None, 2),
           "np": np.float16(3.5), "fn": np.add}
    back, man = exefile.load(io.BytesIO(exefile.dumps(obj, "test", {"k": 1})), "test")
    assert man["meta"] == {"k": 1}
    assert back["a"] is back["b"] and back["a"].dtype == np.int32 and (back["a"] == shared).all()
    assert back["t"].dtype == torch.bfloat16 and back["t"].tolist() == [1.5, -2.0]
    assert np.isnan(back["f"]) and back["big"] == 2 ** 70 and back["s"] == {1, 2} and back["fs"] == frozenset({"x"})
    assert back["tup"] == (1, "two", None) and back["dt"] == np.float16 and back["tdt"] is torch.float16
    assert back["cyc"][0] is back["cyc"] and back["bytes"] == b"\x00\x01" and back["type"] is poplar.FLOAT
    assert back["sl"] == slice(1, None, 2) and back["np"] == np.float16(3.5) and back["fn"] is np.add


def test_unsaveable_objects_raise_poplar_errors():
    with pytest.raises(poplar.poplar_error, match="module-level"):
        exefile.dumps({"k": lambda x: x}, "test")

    class Local:
        pass
    with pytest.raises(poplar.poplar_error):
        exefile.dumps(Local(), "test")


def _rewrite(path, member, data, fix_hash=False):
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[member] = data
    if fix_hash:
        man = json.loads(members["manifest.json"])
        import hashlib
        man["members"][member] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        members["manifest.json"] = json.dumps(man).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)


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
    # one byte changed in the object records: the hash check catches it
    bad.write_bytes(good)
    with zipfile.ZipFile(bad) as z:
        objs = z.read("objects.json")
    _rewrite(bad, "objects.json", objs.replace(b'"n"', b'"m"', 1))
    with pytest.raises(exefile.executable_file_error, match="SHA-256"):
        poplar.Executable.deserialize(str(bad))
    # another version
    bad.write_bytes(good)
    with zipfile.ZipFile(bad) as z:
        man = json.loads(z.read("manifest.json"))
    man["version"] = exefile.VERSION + 1
    _rewrite(bad, "manifest.json", json.dumps(man).encode())
    with pytest.raises(exefile.executable_file_error, match="format version"):
        poplar.Executable.deserialize(str(bad))
    # another kind
    bad.write_bytes(exefile.dumps([1], "poprt.Executable"))
    with pytest.raises(exefile.executable_file_error, match="not a poplar.Executable"):
        poplar.Executable.deserialize(str(bad))


@pytest.mark.parametrize("module,qual", [("os", "system"), ("builtins", "eval"), ("subprocess", "Popen"),
                                         ("openipu.poplar.graph", "_collect_codelets"), ("numpy", "load"),
                                         ("torch", "load"), ("openipu.cli", "main")])
def test_names_outside_the_allow_list_are_refused_even_with_a_valid_hash(tmp_path, module, qual):
    # a crafted file (hashes recomputed) that calls a dangerous function while loading
    records = {"root": {"r": 0}, "records": [
        {"t": "obj", "f": {"r": 1}, "a": {"r": 2}}, {"t": "name", "m": module, "q": qual},
        {"t": "list", "v": ["echo pwned > " + str(tmp_path / "pwned")]}]}
    path = tmp_path / "evil.bin"
    path.write_bytes(exefile.dumps([0], "poplar.Executable"))
    _rewrite(path, "objects.json", json.dumps(records).encode(), fix_hash=True)
    with pytest.raises(exefile.executable_file_error):
        poplar.Executable.deserialize(str(path))
    assert not os.path.exists(tmp_path / "pwned")


def test_allowed_class_names_may_not_be_called_with_file_arguments(tmp_path):
    # openipu classes are rebuilt with __new__ and state; calling one with arguments is refused
    records = {"root": {"r": 0}, "records": [
        {"t": "obj", "f": {"r": 1}, "a": {"r": 2}}, {"t": "name", "m": "openipu.poplar.graph", "q": "Graph"},
        {"t": "list", "v": []}]}
    path = tmp_path / "evil.bin"
    path.write_bytes(exefile.dumps([0], "x"))
    _rewrite(path, "objects.json", json.dumps(records).encode(), fix_hash=True)
    with pytest.raises(exefile.executable_file_error, match="may not be called"):
        exefile.load(str(path))


@pytest.mark.parametrize("module,qual", [("openipu.poplar.graph", "importlib.import_module"),
                                         ("openipu.poplar.graph", "np.load"), ("openipu", "poplar.exefile.save"),
                                         ("numpy", "lib.format.read_array")])
def test_names_may_not_reach_through_modules_or_re_exports(tmp_path, module, qual):
    records = {"root": {"r": 0}, "records": [{"t": "name", "m": module, "q": qual}]}
    path = tmp_path / "evil.bin"
    path.write_bytes(exefile.dumps([0], "x"))
    _rewrite(path, "objects.json", json.dumps(records).encode(), fix_hash=True)
    with pytest.raises(exefile.executable_file_error):
        exefile.load(str(path))


def test_every_registered_onnx_kernel_can_be_named():
    # generic lowerings put these kernels (and their flops hints) into executables
    from openipu.popart.onnx_ops import get_kernel, supported_ops
    for domain, op in supported_ops():
        k = get_kernel(domain, op)
        back, _ = exefile.load(io.BytesIO(exefile.dumps([k.fn, k.flops], "test")))
        for got, want in zip(back, [k.fn, k.flops]):
            if isinstance(want, functools.partial):
                assert (got.func, got.args, got.keywords) == (want.func, want.args, want.keywords), op
            else:
                assert got is want, op
