"""The host weights of a PopART session: ``weightsFromHost`` / ``weightsToHost``,
``writeWeights`` / ``readWeights``, ``modelToHost`` and ``resetHostWeights``, including sharded
optimizer state (each replica's piece, gathered over instances) and replica-grouped variables. A
mixin of :class:`openipu.popart.session._SessionBase` (it reads the session's ``_ir``,
``_host_weights``, ``_lowered``, ``_engine`` and ``options``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from openipu.popart.errors import popart_exception, popart_runtime_error
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
            if tid in self._replica_group and tid not in sharded:   # grouped: each replica its group's value
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
        sharded = self._ir.sharded_state
        if getattr(self, "_fast", None):
            for tid in self._lowered.weights_out:
                if tid in sharded:          # the replicas' pieces (every instance's)
                    self._store_local_pieces(tid, self._fast.local_pieces(tid))
                elif tid in self._replica_group or self._returns_all(tid):
                    self._store_replicas(tid, self._fast.get_replica_weights(tid))
                else:
                    self._host_weights[tid].reshape(-1)[:] = self._fast.get_weight(tid).reshape(-1)
            return
        repl = self.replicationFactor
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
            if tid in sharded:          # a sharded optimizer state: each sharding group's pieces
                self._store_local_pieces(tid, b)
            else:
                self._store_replicas(tid, b)

    def _store_local_pieces(self, tid: str, local: np.ndarray) -> None:
        """The host copy of the sharded state ``tid`` from this instance's replicas' pieces
        (``[local replicas, k]``): with the other instances' pieces in a distributed replicated
        graph (:meth:`_gather_pieces`), stored by :meth:`_store_pieces`."""
        if self.options.getGlobalReplicationFactor() > self.replicationFactor:
            local = self._gather_pieces(tid, local)
        self._store_pieces(tid, local)

    def _local_pieces(self, tid: str) -> np.ndarray:
        """This instance's replicas' pieces of the sharded state ``tid``: ``[local replicas,
        ceil(n / shards)]``: the replica at place ``q`` of its sharding group (all replicas, or
        a replica-grouped weight's group, whose value it takes) holds row ``q`` of its value's
        ``shard_rows``; the rows ``[globalReplicaOffset, + local)`` over all (global) replicas."""
        rows = self._global_pieces(tid)
        off = int(self.options.globalReplicaOffset) if len(rows) > self.replicationFactor else 0
        return np.ascontiguousarray(rows[off:off + self.replicationFactor])

    def _sharding(self, tid: str):
        """``(groups, value group of each group)`` of the sharded state ``tid`` over the global
        replicas: the replica groups its pieces are spread over (each group's replicas in piece
        order), and the index of the host value (``[groups, *shape]`` for a grouped weight's
        state, else 0) each group holds."""
        from openipu.popart.variable_settings import comm_groups
        replicas = self.options.getGlobalReplicationFactor()
        attr = self._ir.sharded_state[tid][2] if len(self._ir.sharded_state[tid]) > 2 else None
        groups = comm_groups(attr, replicas)
        vs = self._ir.variable_settings.get(tid)
        if vs is None or vs.getGroupCount(replicas) <= 1:
            return groups, [0] * len(groups)
        of = vs.group_of(replicas)
        return groups, [of[members[0]] for members in groups]

    def _global_pieces(self, tid: str) -> np.ndarray:
        """``[global replicas, ceil(n / shards)]``: every replica's piece of the sharded state."""
        shards = self._ir.sharded_state[tid][1]
        host = self._host_weights[tid]
        groups, value_of = self._sharding(tid)
        grouped = tid in self._replica_group
        rows = None
        for members, v in zip(groups, value_of):
            pieces = shard_rows(host[v] if grouped else host, shards)
            if rows is None:
                rows = np.zeros((sum(len(m) for m in groups), pieces.shape[1]), pieces.dtype)
            rows[members] = pieces[:len(members)]
        return rows

    def _store_pieces(self, tid: str, rows: np.ndarray) -> None:
        """Take the replicas' pieces ``rows`` (``[global replicas, k]``) of the sharded state
        ``tid`` into its host copy: each sharding group's pieces in order, trimmed (one group per
        host value)."""
        host = self._host_weights[tid]
        groups, value_of = self._sharding(tid)
        grouped = tid in self._replica_group
        done = set()
        for members, v in zip(groups, value_of):
            if v in done:
                continue
            done.add(v)
            dst = host[v] if grouped else host
            dst[...] = rows[members].reshape(-1)[:dst.size].reshape(dst.shape)

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
                host = self._host_weights[init.name]
                value = numpy_helper.to_array(init)
                # a replica-grouped weight's initializer is [groups, *shape] (with the replication
                # factor embedded PopART requires it so; openipu takes it either way)
                if value.shape != host.shape or value.dtype != host.dtype:
                    raise popart_runtime_error("Trying to reset weights using tensor with non matching tensor info. "
                                               f"Tensor ID: {init.name}")
                host[...] = value
                self._replica_values.pop(init.name, None)
            elif not ignoreWeightsInModelWithoutCorrespondingHostWeight:
                raise popart_runtime_error(f"resetWeights, no tensor '{init.name}' in tensors")
