"""The Poplar engine bounds glibc's heap retention when it loads, for every front end, once per
process, and never against the user's own threshold. Each case runs in a fresh process: the
allocator setting is per process and cannot be undone."""

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

from openipu.poplar import hostmem


def _glibc_with_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")       # glibc >= 2.33
    except OSError:
        return False


_glibc = pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc's mallopt and mallinfo2 (Linux)")

# `mmapped()` mallocs a block larger than all the free heap space (so no free chunk can serve it)
# twice, freeing the first, and says whether the second was mmapped. With glibc's dynamic
# threshold the first free raises the threshold above the block (or the threshold was already
# above it) and the second block grows the heap; with the threshold fixed at 4 MB both are mmapped.
_PROBE = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = _Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def mmapped():
    size = libc.mallinfo2().fordblks + (5 << 20)
    assert size < 32 << 20, size          # below glibc's largest dynamic threshold (64-bit)
    libc.free(libc.malloc(size))
    before = libc.mallinfo2().hblks
    b = libc.malloc(size)
    grew = libc.mallinfo2().hblks - before
    libc.free(b)
    return grew == 1
"""

_POPLAR = """
import numpy as np
from openipu import poplar
from openipu.poplar import hostmem, program
from openipu.poplibs import popops, poputil
dev = poplar.IPUModel("ipu2").createDevice()
g = poplar.Graph(dev.getTarget())
x = g.addVariable(poplar.FLOAT, [64], "x")
poputil.mapTensorLinearly(g, x)
prog = program.Sequence()
popops.addInPlace(g, x, 1.0, prog)
g.createHostRead("x", x)
e = poplar.Engine(g, prog)
compiled = mmapped()
e.load(dev)
e.run(0)
"""


def _run(body: str, env_extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    env.update(env_extra or {})
    code = _PROBE + textwrap.dedent(body) + "\nimport json\nprint(json.dumps(result))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


@_glibc
def test_engine_load_fixes_the_threshold_once():
    r = _run(_POPLAR + """
loaded = mmapped()
again = hostmem.bound_heap_retention(64 << 20)    # idempotent: does not move the threshold to 64 MB
result = {"compiled": compiled, "loaded": loaded, "again": again, "after": mmapped()}
""")
    assert r == {"compiled": False, "loaded": True, "again": True, "after": True}


@_glibc
def test_user_threshold_is_left_alone():
    r = _run(_POPLAR + "result = {'applied': hostmem.bound_heap_retention(), 'loaded': mmapped()}",
             {"MALLOC_MMAP_THRESHOLD_": str(64 << 20)})
    assert r == {"applied": False, "loaded": False}


@_glibc
def test_popart_session_gets_it():
    """The ONNX / PopART path (also PopRT's Runner and ``openipu run``) loads through the engine."""
    r = _run("""
import numpy as np
import popart
b = popart.Builder()
x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
o = b.aiOnnx.relu([x])
b.addOutputTensor(o)
s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                            deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
before = mmapped()
s.prepareDevice()
a = s.initAnchorArrays()
s.run(popart.PyStepIO({x: -np.ones((2, 3), np.float32)}, a))
result = {"before": before, "loaded": mmapped(), "out": float(a[o].sum())}
""")
    assert r == {"before": False, "loaded": True, "out": 0.0}


@pytest.mark.parametrize("env, user", [({}, False), ({"MALLOC_MMAP_THRESHOLD_": "1"}, True),
                                        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, True),
                                        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, False)])
def test_user_set_threshold(env, user):
    assert hostmem.user_set_threshold(env) is user
