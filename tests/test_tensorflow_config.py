"""``from tensorflow.python import ipu``: the import hook and ``ipu.config`` (needs the tensorflow
extra: ``make test-tensorflow``)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: E402  (registers the finder where no .pth did)

from tensorflow.python import ipu  # noqa: E402


def test_hook_gives_the_ipu_package_under_graphcores_names():
    assert ipu.__name__ == "tensorflow.python.ipu"
    assert ipu.config.__name__ == "tensorflow.python.ipu.config"
    assert ipu.utils.IPUConfig is ipu.config.IPUConfig
    assert ipu.pipelining_ops.PipelineSchedule.Grouped == 0
    import keras
    import tensorflow.keras as tfk
    assert keras.ipu is tfk.ipu and keras.ipu.PipelineStage is not None


def test_hook_steps_aside_for_graphcores_tensorflow(tmp_path):
    (tmp_path / "ipu").mkdir()
    finder = openipu_tf_hook.IpuImportFinder()
    assert finder.find_spec("tensorflow.python.ipu", [str(tmp_path)]) is None
    assert finder.find_spec("tensorflow.python.ipu", [str(tmp_path / "ipu")]) is not None
    assert finder.find_spec("tensorflow.python.other", None) is None


def test_hook_is_light_and_off_with_env_var():
    env = dict(os.environ, OPENIPU_TF_HOOK="0")
    code = "import openipu_tf_hook, sys; assert 'tensorflow' not in sys.modules; " \
           "print(openipu_tf_hook.IpuImportFinder().find_spec('tensorflow.python.ipu', []))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def test_defaults_and_type_checks():
    cfg = ipu.config.IPUConfig()
    assert cfg.auto_select_ipus == [] and cfg.ipu_model.version == "ipu2"
    assert cfg.optimizations.minimum_remote_tensor_size == 128
    assert cfg.device_connection.type == ipu.config.DeviceConnectionType.ALWAYS
    cfg.auto_select_ipus = 2
    cfg.io_tiles.available_memory_proportion = 1     # an int is a valid float
    assert cfg.io_tiles.available_memory_proportion == 1.0
    with pytest.raises(TypeError, match="Trying to set allow_recompute to 3, but it must be of type bool"):
        cfg.allow_recompute = 3
    with pytest.raises(TypeError, match="must be of type int"):
        cfg.ipu_model.tiles_per_ipu = True
    with pytest.raises(ValueError, match="'auto_select_ipu' is not a valid attribute of this config. Did you mean "
                                         "'auto_select_ipus'?"):
        cfg.auto_select_ipu = 1
    with pytest.raises(Exception, match="matmuls is a category and cannot be assigned to."):
        cfg.matmuls = {}


def test_dict_and_json_round_trip():
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = [1, 1]
    cfg.floating_point_behaviour.esr = ipu.config.StochasticRoundingBehaviour.ON
    cfg.matmuls.poplar_options = {"availableMemoryProportion": "0.3"}
    d = cfg.to_dict()
    assert d["floating_point_behaviour.esr"] == 1 and d["auto_select_ipus"] == [1, 1]
    other = ipu.config.IPUConfig()
    other.from_json(cfg.to_json())
    assert other.to_dict() == d and json.loads(other.to_json()) == json.loads(cfg.to_json())
    assert other.get_attribute_metadata("matmuls.clear_pass_type").default is False
    assert "auto_select_ipus = [1, 1]" in str(other)


def test_configure_checks_with_graphcores_texts(monkeypatch):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.select_ipus = [0]
    with pytest.raises(Exception, match="Only one of `auto_select_ipus` and `select_ipus` can be set."):
        ipu.config.configure_ipu_system(cfg)
    cfg = ipu.config.IPUConfig()
    cfg.device_connection.type = ipu.config.DeviceConnectionType.NEVER
    with pytest.raises(ValueError, match="device_connection.version must be set when device_connection.type is"):
        cfg.configure_ipu_system()
    cfg = ipu.config.IPUConfig()
    cfg.io_tiles.place_ops_on_io_tiles = True
    with pytest.raises(ValueError, match=r"Cannot place ops on I/O tiles when io_tiles.num_io_tiles == 0"):
        cfg.configure_ipu_system()
    cfg = ipu.config.IPUConfig()
    cfg.select_ipus = [0]
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model")
    with pytest.raises(Exception, match="only be specified with `auto_select_ipus`"):
        cfg.configure_ipu_system()
    with pytest.raises(TypeError, match="`config` must be an IpuOptions instance."):
        ipu.config.configure_ipu_system({"auto_select_ipus": 1})
    cfg = ipu.config.IPUConfig()
    cfg.matmuls.poplar_options = {"availableMemoryProportion": 0.3}
    monkeypatch.delenv("TF_POPLAR_FLAGS")
    with pytest.raises(TypeError, match="must be a str"):
        cfg.configure_ipu_system()


def test_configure_records_the_ipus():
    ipu.config.reset_ipu_configuration()
    with pytest.raises(RuntimeError, match="No IPU devices configured."):
        ipu.config.get_ipu_config()
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    ipu.config.configure_ipu_system(cfg)
    cfg.auto_select_ipus = 4            # the applied configuration is a copy
    assert ipu.config.get_ipu_config()[0].auto_select_ipus == 2
    assert ipu.utils.get_num_of_ipus_in_device("/device:IPU:0") == 2


def test_strategy_run_needs_a_tf_function():
    import tensorflow as tf
    strategy = ipu.ipu_strategy.IPUStrategy()
    with pytest.raises(ValueError, match=r"IPUStrategyV1.run\(fn, ...\) does not support eager execution."):
        strategy.run(lambda: 1)
    assert float(strategy.run(tf.function(lambda x: x * 2), args=(tf.constant(3.0),))) == 6.0
    with pytest.raises(RuntimeError, match="PipelineStage may only be used from within an IPUStrategy context."):
        with ipu.keras_ipu.PipelineStage(0):
            pass
    with strategy.scope():
        with ipu.keras_ipu.PipelineStage(0):
            with pytest.raises(RuntimeError, match="Pipeline stages must not be nested."):
                with ipu.keras_ipu.PipelineStage(1):
                    pass


def test_feeds_and_loops():
    import numpy as np
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices(np.arange(8, dtype=np.float32)).batch(3)
    with pytest.raises(ValueError,
                       match=r"is not fully defined. If using tf.Dataset.batch, set `drop_remainder=True`."):
        ipu.ipu_infeed_queue.IPUInfeedQueue(ds)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensor_slices(np.arange(8, dtype=np.float32)).batch(2, drop_remainder=True))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    with pytest.raises(ValueError, match="Trying to dequeue an outfeed which has not been enqueued."):
        outfeed.dequeue()

    def body(total, x):
        outfeed.enqueue(x)
        return total + tf.reduce_sum(x)
    total = ipu.loops.repeat(4, body, inputs=[tf.constant(0.0)], infeed_queue=infeed)
    assert float(total[0]) == 28.0
    assert outfeed.dequeue().numpy().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
