"""Targets and IPUModel fields carry the published figures."""

import pytest

from openipu import ipu, poplar


def test_generations():
    t1, t2, bow = ipu.target("ipu1"), ipu.target("ipu2"), ipu.target("bow")
    assert (t1.tiles_per_ipu, t1.bytes_per_tile, t1.clock_hz) == (1216, 256 * 1024, 1.6e9)
    assert (t2.tiles_per_ipu, t2.bytes_per_tile, t2.clock_hz) == (1472, 624 * 1024, 1.33e9)
    # gc-flops measured 87.1078 TFLOPS fp32 on Bow; 16 MAC x 2 flops x 1472 tiles x 1.85 GHz is the
    # theoretical 87.1424, of which the measurement is 99.96%
    assert 2 * bow.amp_macs["float"] * bow.num_tiles * bow.clock_hz == pytest.approx(87.1078e12, rel=1e-3)
    # M2000 1 PFLOPS fp16 over 4 IPUs
    assert 4 * 2 * t2.amp_macs["half"] * t2.num_tiles * t2.clock_hz == pytest.approx(1.0e15, rel=0.01)
    assert all(ipu.source(v, "clock_hz") for v in ipu.FACTS)
    assert ipu.SYSTEMS["IPU-POD16"].target().num_ipus == 16


def test_ipu_model_fields_and_target_getters():
    m = poplar.IPUModel("ipu1")
    m.numIPUs, m.tilesPerIPU = 2, 16
    t = m.createDevice().getTarget()
    assert (t.getNumIPUs(), t.getTilesPerIPU(), t.getNumTiles(), t.getBytesPerTile()) == (2, 16, 32, 262144)
    assert (t.getNumWorkerContexts(), t.getExchangeBytesPerCycle(), t.getTargetArchString()) == (6, 4, "ipu1")
    assert t.getVectorWidth(poplar.HALF) == 4 and t.getVectorWidth(poplar.FLOAT) == 2
    assert poplar.IPUModel().createDevice().getTarget().getTileClockFrequency() == 1.33e9
    with pytest.raises(poplar.invalid_option):
        poplar.IPUModel("ipu9")
    bad = poplar.IPUModel(); bad.tilesPerIPU = 0
    with pytest.raises(poplar.invalid_option):
        bad.createDevice()


def test_device_manager_and_cpu_device():
    devs = poplar.DeviceManager.createDeviceManager().getDevices(poplar.TargetType.IPU, 4)
    assert devs[0].attach() and devs[0].getTarget().getNumIPUs() == 4
    assert poplar.DeviceManager().getDevices(poplar.TargetType.IPU, 3) == []
    assert poplar.Device.createCPUDevice().getTarget().getNumTiles() == 1
    assert poplar.createOfflineTarget("ipu21").getTargetArchString() == "ipu21"
