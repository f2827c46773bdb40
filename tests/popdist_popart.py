"""Three training steps of a PopART MLP (8 -> 15 -> 4, a bias of 15 elements) with 4 replicas,
for ``test_popdist.py``: under ``poprun`` with ``popdist.popart`` (this instance's replicas and
rows), else one process with ``replicatedGraphCount`` 4. Every instance draws different initial
weights and ``TrainingSession.broadcastWeights()`` makes them instance 0's.

``python popdist_popart.py OUT [rts] [adam]`` writes the weights (``np.savez``; instance ``i``
writes ``OUT.i.npz``) and prints which execution path ran the steps (``executor: ir|device``).
Default: SGD with momentum 0.9 (Mean reduction). ``adam``: Adam (lr 0.01) instead. ``rts``: the
optimizer state (SGD's momentum, Adam's first and second moments) sharded over the replicas
(replicated tensor sharding; over every instance's replicas under ``poprun``) and written too:
each replica holds ``ceil(n / 4)`` elements of each state tensor (the bias's 15: 4, padded)."""

import sys

import numpy as np

import popart
import popdist

REPLICAS, MICRO, STEPS, HIDDEN = 4, 2, 3, 15
RTS, ADAM = "rts" in sys.argv[2:], "adam" in sys.argv[2:]

b = popart.Builder()
rng = np.random.default_rng(popdist.getInstanceIndex())     # each instance its own initial weights: ...
x = b.addInputTensor(popart.TensorInfo("FLOAT", [MICRO, 8]), "x")
w1 = b.addInitializedInputTensor(rng.standard_normal((8, HIDDEN)).astype(np.float32) * 0.3, "w1")
b1 = b.addInitializedInputTensor(rng.standard_normal(HIDDEN).astype(np.float32) * 0.1, "b1")
w2 = b.addInitializedInputTensor(rng.standard_normal((HIDDEN, 4)).astype(np.float32) * 0.3, "w2")
h = b.aiOnnx.relu([b.aiOnnx.add([b.aiOnnx.matmul([x, w1]), b1])])
loss = b.aiGraphcore.l1loss([b.aiOnnx.matmul([h, w2])], 0.1, reduction=popart.ReductionType.Mean)
o = popart.SessionOptions()
o.accumulationAndReplicationReductionType = popart.ReductionType.Mean
if RTS:     # the optimizer state sharded over the (global) replicas
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
if ADAM:
    opt = popart.Adam({"defaultLearningRate": (0.01, False)}, mode=popart.AdamMode.Adam)
    state = ["Accl1___", "Accl2___"]
else:
    mode = popart.SGDAccumulatorAndMomentum.Separate if RTS else popart.SGDAccumulatorAndMomentum.Combined
    opt = popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False)}, accumulatorAndMomentum=mode)
    state = ["Accl1___"]
s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                           opt, device, userOptions=o)
s.prepareDevice()
s.broadcastWeights()                                         # ... instance 0's win (a no-op in one process)
s.weightsFromHost()
data = np.random.default_rng(1).standard_normal((STEPS, REPLICAS, MICRO, 8)).astype(np.float32)
anchors = s.initAnchorArrays()
for step in range(STEPS):
    s.run(popart.PyStepIO({x: data[step, lo:lo + n]}, anchors))
w = {"w1": np.zeros((8, HIDDEN), np.float32), "b1": np.zeros(HIDDEN, np.float32),
     "w2": np.zeros((HIDDEN, 4), np.float32)}
if RTS:     # the optimizer state too (each instance's host copy gathers every instance's pieces)
    sharded = {p + k for p in state for k in w}
    assert set(s._ir.sharded_state) >= sharded, s._ir.sharded_state
    w.update({t: np.zeros_like(w[t.split("___")[1]]) for t in sharded})
s.weightsToHost()
s.readWeights(popart.PyWeightsIO(w))
np.savez(out, **w)
# which path ran the steps; one write per line (the instances share poprun's stdout)
sys.stdout.write(f"executor: {'ir' if getattr(s, '_fast', None) else 'device'}\n")
sys.stdout.flush()
