"""``popdist.tensorflow`` + ``ipu.distributed.popdist_strategy.PopDistStrategy`` (issue 41):
Keras ``fit`` under ``poprun --num-instances 2`` (one replica each, different initial weights
broadcast from instance 0) ends with the same weights on both instances as one process with 2
replicas on the same batches."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

HERE = Path(__file__).resolve().parent


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    for k in [k for k in env if k.startswith("POPDIST_")]:
        del env[k]
    return env


@pytest.mark.slow
def test_keras_fit_under_poprun_matches_one_process(tmp_path):
    script = [sys.executable, str(HERE / "tensorflow_popdist_fit.py")]
    r = subprocess.run(script + [str(tmp_path / "one"), "2"], env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "openipu.popdist.poprun", "--num-instances", "2", "--num-replicas", "2",
                        *script, str(tmp_path / "two"), "2"], env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    one = np.load(tmp_path / "one.npz")
    parts = [np.load(tmp_path / f"two.{i}.npz") for i in range(2)]
    assert len(one.files) == 4
    for k in one.files:
        np.testing.assert_array_equal(parts[0][k], parts[1][k])         # the instances agree exactly
        np.testing.assert_allclose(parts[0][k], one[k], rtol=1e-5, atol=1e-6)


def test_set_ipu_config_and_strategy_outside_poprun():
    import openipu_tf_hook  # noqa: F401
    import popdist.tensorflow
    from tensorflow.python import ipu
    cfg = ipu.config.IPUConfig()
    assert popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=2) is cfg
    assert cfg.auto_select_ipus == 2
    assert cfg.experimental.multi_replica_distribution.process_count == 1
    cfg.configure_ipu_system()
    from tensorflow.python.ipu.distributed import popdist_strategy
    s = popdist_strategy.PopDistStrategy()
    assert isinstance(s, ipu.ipu_strategy.IPUStrategyV1)
    import tensorflow as tf
    np.testing.assert_array_equal(ipu.distributed.allreduce(tf.constant([1.0, 2.0])), [1.0, 2.0])
    with pytest.raises(ValueError, match="ipus_per_replica"):
        popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=0)


def test_custom_step_in_a_poprun_instance_is_refused():
    import openipu_tf_hook  # noqa: F401
    import tensorflow as tf
    from tensorflow.python import ipu
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.experimental.multi_replica_distribution.process_count = 2
    cfg.configure_ipu_system()
    try:
        with pytest.raises(NotImplementedError, match="poprun instance"):
            ipu.ipu_strategy.IPUStrategy().run(tf.function(lambda: tf.constant(1.0)))
    finally:
        ipu.config.reset_ipu_configuration()
