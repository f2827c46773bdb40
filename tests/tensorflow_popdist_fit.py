"""Keras ``fit`` of a small MLP with ``popdist.tensorflow`` and ``PopDistStrategy`` (run by
``tests/test_tensorflow_popdist.py``): under ``poprun`` each instance builds the model with its own
seed (instance 0's weights are broadcast), takes every other batch and saves its weights to
``OUT.<instance>.npz``; alone it runs ``--replicas`` replicas in one process and saves ``OUT.npz``."""

import sys

import numpy as np
import openipu_tf_hook  # noqa: F401

import keras
import popdist
import popdist.tensorflow
import tensorflow as tf
from tensorflow.python import ipu
from tensorflow.python.ipu.distributed import popdist_strategy

out, replicas = sys.argv[1], int(sys.argv[2])
config = ipu.config.IPUConfig()
popdist.tensorflow.set_ipu_config(config)
if not popdist.isPopdistEnvSet():
    config.auto_select_ipus = replicas
config.configure_ipu_system()
strategy = popdist_strategy.PopDistStrategy()

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype(np.float32)
y = rng.integers(0, 3, (64,)).astype(np.int32)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
ds = ds.shard(popdist.getNumInstances(), popdist.getInstanceIndex())      # instance i: batches i, i + n, ...

with strategy.scope():
    keras.utils.set_random_seed(3 + popdist.getInstanceIndex())           # differing initial weights
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                  steps_per_execution=len(ds) // popdist.getNumLocalReplicas() // 2)
    model.fit(ds, epochs=2, verbose=0)
name = f"{out}.{popdist.getInstanceIndex()}.npz" if popdist.isPopdistEnvSet() else f"{out}.npz"
np.savez(name, *model.get_weights())
sys.stdout.write(f"saved {name}\n")
