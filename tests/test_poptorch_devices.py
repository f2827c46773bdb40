"""Busy devices in a simulated system of fixed size (``OPENIPU_NUM_IPUS``): PopART's device
manager hands out gc-info's devices whose IPUs are free, across processes (file locks in the
state directory); PopTorch raises "Failed to acquire N IPU(s)" or waits with
``POPTORCH_WAIT_FOR_IPU=1``; ``ConnectionType.OnDemand`` compiles without the device and takes
it on the first run; ``detachFromDevice`` frees it for others."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import popart
import poptorch
from openipu.poptorch import _device


@pytest.fixture
def system(monkeypatch, tmp_path):
    def make(n):
        monkeypatch.setenv("OPENIPU_NUM_IPUS", str(n))
        monkeypatch.setenv("OPENIPU_STATE_DIR", str(tmp_path))
        monkeypatch.delenv("POPTORCH_WAIT_FOR_IPU", raising=False)
        return tmp_path
    return make


def test_popart_hands_out_free_devices_only(system):
    system(2)
    dm = popart.DeviceManager()
    a = dm.acquireAvailableDevice(1)
    b = dm.acquireAvailableDevice(1)
    assert (a.id, b.id) == (0, 1) and a.isAttached and b.isAttached
    assert dm.tryAcquireAvailableDevice(1) is None
    assert dm.tryAcquireAvailableDevice(2) is None          # device 2 = IPUs 0 and 1
    with pytest.raises(popart.popart_exception, match="Failed to acquire device with 1 IPUs"):
        dm.acquireAvailableDevice(1)
    assert dm.tryAcquireDeviceById(0) is None
    a.detach()
    c = dm.acquireDeviceById(0)
    assert c.id == 0 and c.isAttached
    c.detach()
    b.detach()
    pair = dm.acquireAvailableDevice(2)
    assert pair.id == 2 and pair.numIpus == 2
    od = dm.acquireAvailableDevice(1, connectionType=popart.DeviceConnectionType.OnDemand)
    assert not od.isAttached and not od.attach()            # its IPU is part of the pair
    pair.detach()
    assert od.attach() and od.isAttached
    od.detach()
    with pytest.raises(popart.popart_exception, match="Failed to acquire device with 4 IPUs"):
        dm.acquireAvailableDevice(4)


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


@pytest.mark.slow
def test_poptorch_models_share_one_ipu_by_detaching(system):
    system(1)
    x = torch.ones(2, 4)
    a = poptorch.inferenceModel(_linear())
    ref = a(x)
    with pytest.raises(poptorch.Error, match=r"Failed to acquire 1 IPU\(s\)"):
        poptorch.inferenceModel(_linear())(x)
    b = poptorch.inferenceModel(_linear(), poptorch.Options().connectionType(poptorch.ConnectionType.OnDemand))
    b.compile(x)                                            # OnDemand: compiled without the IPU
    assert not b.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match=r"Failed to acquire 1 IPU\(s\)"):
        b(x)
    a.detachFromDevice()
    torch.testing.assert_close(b(x), ref)
    with pytest.raises(poptorch.Error, match=r"Failed to acquire 1 IPU\(s\)"):
        a(x)                                                # re-attaching: b holds the IPU
    b.destroy()
    torch.testing.assert_close(a(x), ref)
    with pytest.raises(poptorch.Error, match="No device found on the system with 2 IPUs"):
        poptorch.inferenceModel(_linear(), poptorch.Options().replicationFactor(2))(torch.ones(2, 2, 4))


HOLDER = """
import sys, popart
d = popart.DeviceManager().acquireAvailableDevice(1)
print("holding", d.id, flush=True)
sys.stdin.readline()
d.detach()
print("released", flush=True)
sys.stdin.readline()
"""


@pytest.mark.slow
def test_a_second_process_raises_or_waits_for_the_busy_ipu(system, monkeypatch):
    state = system(1)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "OPENIPU_STATE_DIR": str(state)})
    try:
        assert holder.stdout.readline().split() == ["holding", "0"]
        x = torch.ones(2, 4)
        with pytest.raises(poptorch.Error, match=r"Failed to acquire 1 IPU\(s\)"):
            poptorch.inferenceModel(_linear())(x)
        monkeypatch.setenv("POPTORCH_WAIT_FOR_IPU", "1")
        monkeypatch.setattr(_device, "WAIT_SECONDS", 0.05)
        released = []

        def release():
            time.sleep(1.0)
            released.append(time.monotonic())
            holder.stdin.write("\n")
            holder.stdin.flush()
        t = threading.Thread(target=release)
        t.start()
        out = poptorch.inferenceModel(_linear())(x)        # waits until the holder detaches
        t.join()
        assert released and out.shape == (2, 2)
        assert holder.stdout.readline().strip() == "released"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
