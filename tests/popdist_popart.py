"""Three SGD (momentum, Mean reduction) steps of a PopART MLP with 4 replicas, for
``test_popdist.py``: under ``poprun`` with ``popdist.popart`` (this instance's replicas and rows),
else one process with ``replicatedGraphCount`` 4. Every instance draws different initial weights
and ``TrainingSession.broadcastWeights()`` makes them instance 0's. ``python popdist_popart.py OUT`` writes the
weights (``np.savez``; instance ``i`` writes ``OUT.i.npz``). ``python popdist_popart.py OUT rts``:
the momentum sharded over the replicas (replicated tensor sharding; over the instances' replicas
under ``poprun``) and written too."""

import sys

import numpy as np

import popart
import popdist

REPLICAS, MICRO, STEPS = 4, 2, 3

b = popart.Builder()
rng = np.random.default_rng(popdist.getInstanceIndex())     # each instance its own initial weights: ...
x = b.addInputTensor(popart.TensorInfo("FLOAT", [MICRO, 8]), "x")
w1 = b.addInitializedInputTensor(rng.standard_normal((8, 16)).astype(np.float32) * 0.3, "w1")
w2 = b.addInitializedInputTensor(rng.standard_normal((16, 4)).astype(np.float32) * 0.3, "w2")
h = b.aiOnnx.relu([b.aiOnnx.matmul([x, w1])])
loss = b.aiGraphcore.l1loss([b.aiOnnx.matmul([h, w2])], 0.1, reduction=popart.ReductionType.Mean)
o = popart.SessionOptions()
o.accumulationAndReplicationReductionType = popart.ReductionType.Mean
RTS = sys.argv[2:] == ["rts"]
if RTS:     # the momentum sharded over the (global) replicas
    o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = popart.ReplicatedTensorSharding.On
    o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 4
if popdist.isPopdistEnvSet():
    import popdist.popart
    popdist.popart.configureSessionOptions(o)
    device = popdist.popart.getDevice()
    lo, n = popdist.getReplicaIndexOffset(), popdist.getNumLocalReplicas()
    out = f"{sys.argv[1]}.{popdist.getInstanceIndex()}"
else:
    o.enableReplicatedGraphs, o.replicatedGraphCount = True, REPLICAS
    device = popart.DeviceManager().acquireAvailableDevice(REPLICAS)
    lo, n, out = 0, REPLICAS, sys.argv[1]
s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                           popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False)},
                                      accumulatorAndMomentum=getattr(popart.SGDAccumulatorAndMomentum,
                                                                     "Separate" if RTS else "Combined")),
                           device, userOptions=o)
s.prepareDevice()
s.broadcastWeights()                                         # ... instance 0's win (a no-op in one process)
s.weightsFromHost()
data = np.random.default_rng(1).standard_normal((STEPS, REPLICAS, MICRO, 8)).astype(np.float32)
anchors = s.initAnchorArrays()
for step in range(STEPS):
    s.run(popart.PyStepIO({x: data[step, lo:lo + n]}, anchors))
w = {"w1": np.zeros((8, 16), np.float32), "w2": np.zeros((16, 4), np.float32)}
if RTS:     # the momentum too (each instance's host copy gathers every instance's pieces)
    assert {t for t in s._ir.sharded_state} >= {"Accl1___w1", "Accl1___w2"}, s._ir.sharded_state
    w.update({"Accl1___w1": np.zeros((8, 16), np.float32), "Accl1___w2": np.zeros((16, 4), np.float32)})
s.weightsToHost()
s.readWeights(popart.PyWeightsIO(w))
np.savez(out, **w)
