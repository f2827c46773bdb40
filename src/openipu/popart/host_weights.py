"""The host weights of a PopART session: ``weightsFromHost`` / ``weightsToHost``,
``writeWeights`` / ``readWeights``, ``modelToHost`` and ``resetHostWeights``, including sharded
optimizer state (each replica's piece, gathered over instances) and replica-grouped variables. A
mixin of :class:`openipu.popart.session._SessionBase` (it reads the session's ``_ir``,
``_host_weights``, ``_lowered``, ``_engine`` and ``options``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from openipu.popart.errors import popart_exception
from openipu.popart import tensor_proto
from openipu.popart.ir import shard_rows


class HostWeightsMixin:
    """``Session`` methods moving weights between the host and the device (PopART's API)."""

    def weightsFromHost(self) -> None:  # noqa: N802
        """Copy the host copies of the weights (``constantWeights=False``) to the device."""
        self._check_runnable()
        if not self._lowered.weights_in:
            return
        sharded = self._ir.sharded_state
        for tid, h in self._lowered.weights_in.items():
            host = self._host_weights[tid]
            # a sharded optimizer state: each replica receives its piece
            if tid in self._replica_group:      # a grouped variable: each replica its group's value
                host = np.ascontiguousarray(self._replica_view(tid))
            self._engine.connectStream(h, self._local_pieces(tid).reshape(-1) if tid in sharded else host.reshape(-1))
        self._engine.run(1, "weightsFromHost")
        if getattr(self, "_fast", None):
            self._fast.set_weights(self._host_weights)

    def _device_weights(self) -> dict | None:
        """The device's variables (id -> ``torch.Tensor``, replica 0, shared with the device:
        read, do not change) when the session runs on the IR executor and is loaded, else None
        (then ``weightsToHost`` and the host copies). openipu's own: PopTorch reads the trained
        weights into the module from here, without the host copies."""
        if self._engine is None or self._engine._storage is None:
            return None
        fast = getattr(self, "_fast", None)
        return fast.weights if fast else None

    def weightsToHost(self) -> None:  # noqa: N802
        """Copy the device weights back to their host copies."""
        self._check_runnable()
        if not self._lowered.weights_out:
            return
        if getattr(self, "_fast", None):
            for tid in self._lowered.weights_out:
                if tid in self._replica_group or self._returns_all(tid):
                    self._store_replicas(tid, self._fast.get_replica_weights(tid))
                else:
                    self._host_weights[tid].reshape(-1)[:] = self._fast.get_weight(tid).reshape(-1)
            return
        repl = self.replicationFactor
        sharded = self._ir.sharded_state
        # one replica, not sharded: the device writes straight into the host copy (the engine keeps
        # a connected buffer, so a staging buffer per weight would stay alive: one more host copy
        # of every weight and optimizer state)
        bufs = {tid: (self._local_pieces(tid) if tid in sharded else
                      np.zeros((repl, *self._ir.tensors[tid].info.shape()), self._host_weights[tid].dtype))
                for tid in self._lowered.weights_out if repl > 1 or tid in sharded}
        for tid, h in self._lowered.weights_out.items():
            self._engine.connectStream(h, (bufs[tid] if tid in bufs else self._host_weights[tid]).reshape(-1))
        self._engine.run(2, "weightsToHost")
        for tid, b in bufs.items():
            host = self._host_weights[tid]
            if tid in sharded and sharded[tid][1] > repl:       # the other instances' pieces too
                b = self._gather_pieces(tid, b)
            # a sharded optimizer state: the replicas' pieces, in order, trimmed
            if tid in sharded:
                host[...] = b.reshape(-1)[:host.size].reshape(host.shape)
            else:
                self._store_replicas(tid, b)

    def _local_pieces(self, tid: str) -> np.ndarray:
        """This instance's replicas' pieces of the sharded state ``tid``: ``[local replicas,
        ceil(n / shards)]``, the rows ``[globalReplicaOffset, + local)`` of its ``shard_rows`` over
        all (global) replicas."""
        shards = self._ir.sharded_state[tid][1]
        off = int(self.options.globalReplicaOffset) if shards > self.replicationFactor else 0
        return np.ascontiguousarray(shard_rows(self._host_weights[tid], shards)[off:off + self.replicationFactor])

    def _gather_pieces(self, tid: str, local: np.ndarray) -> np.ndarray:
        """Every instance's pieces of the sharded state ``tid`` (a distributed replicated graph):
        ``[global replicas, k]`` from this instance's ``[local, k]``, over ``torch.distributed``
        (every instance must call ``weightsToHost``). Raises ``popart_exception`` when an
        instance is lost or the gather times out."""
        import torch

        from openipu.poplar.errors import poplar_error
        from openipu.poplibs import gcl_instances
        try:
            return gcl_instances.gather_replicas(torch.from_numpy(local), f"weightsToHost {tid}").numpy()
        except poplar_error as e:
            raise popart_exception(str(e)) from None

    def _check_writable_weights(self, what: str):
        if self.options.constantWeights:
            raise popart_exception(f"Cannot call {what} when constantWeights is set. Set "
                                   "SessionOptions.constantWeights = False so that weights are device variables")

    def writeWeights(self, weightsIo) -> None:  # noqa: N802,N803
        """Set weights from ``PyWeightsIO``: the host copies, and the device too once prepared."""
        if not all(tid in self._host_weights for tid in weightsIo.weights):    # (grouped weights stay
            self._check_writable_weights("writeWeights")                         # variables)
        for tid, arr in weightsIo.weights.items():
            if tid not in self._host_weights:
                raise popart_exception(f"Tensor {tid} is not a weight of this session: weights are "
                                       f"{', '.join(sorted(self._host_weights)) or 'none'}")
            dst = self._host_weights[tid]
            arr = np.asarray(arr)
            per = self._ir.tensors[tid].info.nelms()
            if arr.size == self.replicationFactor * per != dst.size and self._returns_all(tid):
                # AllReplicas: one value per replica; each group takes its first replica's
                self._store_replicas(tid, arr.reshape(self.replicationFactor, -1))
                self._replica_values.pop(tid, None)
                continue
            if arr.size != dst.size:
                raise popart_exception(f"writeWeights: tensor {tid} has {dst.size} elements but the buffer has "
                                       f"{arr.size}")
            dst.reshape(-1)[:] = arr.reshape(-1).astype(dst.dtype)
            self._replica_values.pop(tid, None)
        if self._engine is not None and self._engine._storage is not None:
            self.weightsFromHost()

    def readWeights(self, weightsIo) -> None:  # noqa: N802,N803
        """Fill ``PyWeightsIO`` arrays from the host copies (call ``weightsToHost`` first)."""
        for tid, arr in weightsIo.weights.items():
            if tid in self._host_weights:
                src = self._returned_values(tid)
            elif tid in self._ir.tensors and self._ir.tensors[tid].kind == "Const" and tid in self._initializers():
                src = self._ir.tensors[tid].value
            else:
                raise popart_exception(f"Tensor {tid} is not a weight of this session")
            if arr.size != src.size:
                raise popart_exception(f"readWeights: tensor {tid} has {src.size} elements but the buffer has "
                                       f"{arr.size}")
            arr.reshape(-1)[:] = src.reshape(-1)

    def _initializers(self) -> set:
        return {i.name for i in self._ir.model.graph.initializer}

    def modelToHost(self, fn: str) -> None:  # noqa: N802
        """Write the ONNX model with the current weights (fetched from the device) to ``fn``. A
        training session also writes its optimizer state (``Accl1___<w>``, ``Step___<w>``, ...)
        as initializers, as PopART does: a session made from that file resumes from it."""
        if self._engine is not None and self._engine._storage is not None and self._host_weights:
            self.weightsToHost()
        m = onnx.ModelProto()
        m.CopyFrom(self._ir.model)
        names = set()
        # PopART's storage (openipu.popart.tensor_proto): each initializer keeps its field
        # (raw_data, or float_data ...), the optimizer state is added in the typed fields
        for init in m.graph.initializer:
            names.add(init.name)
            if init.name in self._host_weights:
                tensor_proto.write_into(init, self._host_weights[init.name])
                if init.name in self._replica_group:     # grouped: the [groups, *shape] value
                    del init.dims[:]
                    init.dims.extend(self._host_weights[init.name].shape)
                    for vi in m.graph.input:
                        if vi.name == init.name:
                            dims = vi.type.tensor_type.shape.dim
                            del dims[:]
                            for d in self._host_weights[init.name].shape:
                                dims.add().dim_value = int(d)
            elif init.name in self._ir.weights:     # a weight the IR took out of its proto
                tensor_proto.write_into(init, np.asarray(self._ir.weights[init.name]))
        for tid, arr in self._host_weights.items():
            if tid not in names:                   # optimizer state
                m.graph.initializer.append(tensor_proto.typed_tensor(arr, tid))
        onnx.save(m, fn)

    def resetHostWeights(self, modelProtoOrFilename, ignoreWeightsInModelWithoutCorrespondingHostWeight=False):  # noqa: N802,N803
        self._check_writable_weights("resetHostWeights")
        from openipu.popart.builder import _load_model
        m = _load_model(modelProtoOrFilename)
        for init in m.graph.initializer:
            if init.name in self._host_weights:
                self._host_weights[init.name][...] = numpy_helper.to_array(init)
            elif not ignoreWeightsInModelWithoutCorrespondingHostWeight:
                raise popart_exception(f"resetWeights, no tensor '{init.name}' in tensors")
