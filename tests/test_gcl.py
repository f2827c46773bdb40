"""gcl collectives: results against numpy across replicas and IPUs; ring-schedule costs."""

import io

import numpy as np
import pytest

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import gcl, poputil
from openipu.poplibs.gcl import CollectiveOperator as Op
from openipu.poplibs.gcl import CommGroup, CommGroupType

_TYPES = {np.dtype(np.float32): poplar.FLOAT, np.dtype(np.float16): poplar.HALF, np.dtype(np.int32): poplar.INT,
          np.dtype(np.bool_): poplar.BOOL}


def _device(num_ipus, tiles):
    m = poplar.IPUModel()
    m.numIPUs, m.tilesPerIPU = num_ipus, tiles
    return m.createDevice()


class Rep:
    """A replicated graph whose input ``x`` holds ``data[r]`` on replica ``r`` (streamed in)."""

    def __init__(self, data, replicas, tiles=4, ipus_per_replica=1, mapping="linear"):
        self.data = np.asarray(data)
        self.dev = _device(replicas * ipus_per_replica, tiles)
        self.g = poplar.Graph(self.dev.getTarget(), replication_factor=replicas)
        self.R = replicas
        shape = list(self.data.shape[1:])
        self.x = self.g.addVariable(_TYPES[self.data.dtype], shape, "x")
        if isinstance(mapping, str):
            poputil.mapTensorLinearly(self.g, self.x)
        else:
            self.g.setTileMapping(self.x, mapping)
        self.prog = P.Sequence()
        fifo = self.g.addHostToDeviceFIFO("in", self.x.elementType(), self.x.numElements())
        self.prog.add(P.Copy(fifo, self.x))
        self.body = P.Sequence()
        self.prog.add(self.body)

    def run(self, out):
        fifo = self.g.addDeviceToHostFIFO("out", out.elementType(), out.numElements())
        self.prog.add(P.Copy(out, fifo))
        self.engine = poplar.Engine(self.g, self.prog)
        self.engine.load(self.dev)
        self.engine.connectStream("in", np.ascontiguousarray(self.data.reshape(self.R, -1)))
        res = np.zeros((self.R, out.numElements()), self.data.dtype)
        self.engine.connectStream("out", res)
        self.engine.run()
        return res.reshape([self.R] + out.shape())


def _reference(x, op):
    if op == "LOCAL":
        return x
    if op == "SQUARE_ADD":
        r = (x.astype(np.float64) ** 2).sum(0)
    elif op in ("ADD", "MEAN"):
        r = x.astype(np.float64).sum(0)
        if op == "MEAN":
            r = r / x.shape[0] if x.dtype.kind == "f" else np.trunc(r / x.shape[0])
    else:
        r = {"MUL": np.prod, "MIN": np.min, "MAX": np.max, "LOGICAL_AND": np.all, "LOGICAL_OR": np.any}[op](x, axis=0)
    return np.broadcast_to(r, x.shape)


def _tol(dtype, p):
    return dict(rtol=3e-3 * p, atol=3e-3 * p) if dtype == np.float16 else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("shape,dtype", [([7], np.float32), ([3, 5], np.float16), ([2, 3, 4], np.int32)])
@pytest.mark.parametrize("op", ["ADD", "MEAN", "MAX", "MIN"])
def test_all_reduce_cross_replica_matches_numpy(R, shape, dtype, op):
    rng = np.random.default_rng(R)
    data = (rng.standard_normal([R] + shape) * 3).astype(dtype)
    h = Rep(data, R)
    out = gcl.allReduceCrossReplica(h.g, h.x, op, h.body, debug_name="ar")
    assert out.shape() == shape and out.elementType() == h.x.elementType()
    np.testing.assert_allclose(h.run(out).astype(np.float64), _reference(data, op), **_tol(dtype, R))


@pytest.mark.parametrize("op", ["MUL", "SQUARE_ADD", "LOCAL"])
def test_all_reduce_other_operators(op):
    data = np.random.default_rng(1).uniform(0.5, 1.5, [4, 6]).astype(np.float32)
    h = Rep(data, 4)
    out = gcl.allReduceCrossReplica(h.g, h.x, op, h.body)
    np.testing.assert_allclose(h.run(out), _reference(data, op), rtol=1e-5)


@pytest.mark.parametrize("op", ["LOGICAL_AND", "LOGICAL_OR"])
def test_all_reduce_logical_on_bools(op):
    data = np.random.default_rng(2).random([4, 9]) > 0.3
    h = Rep(data, 4)
    out = gcl.allReduceCrossReplica(h.g, h.x, op, h.body)
    np.testing.assert_array_equal(h.run(out), _reference(data, op))


@pytest.mark.parametrize("gtype,size", [(CommGroupType.CONSECUTIVE, 2), (CommGroupType.CONSECUTIVE, 4),
                                        (CommGroupType.ORTHOGONAL, 2), (CommGroupType.ORTHOGONAL, 4)])
def test_comm_groups_reduce_within_each_group(gtype, size):
    R = 8
    data = np.arange(R * 3, dtype=np.float32).reshape(R, 3) ** 2
    h = Rep(data, R)
    out = gcl.allReduceCrossReplica(h.g, h.x, Op.ADD, h.body, CommGroup(gtype, size), "grouped")
    got = h.run(out)
    for r in range(R):
        members = ([r // size * size + i for i in range(size)] if gtype == CommGroupType.CONSECUTIVE
                   else [r % (R // size) + i * (R // size) for i in range(size)])
        np.testing.assert_allclose(got[r], data[members].sum(0))


def test_in_place_and_to_destination():
    data = np.random.default_rng(3).standard_normal([4, 10]).astype(np.float32)
    h = Rep(data, 4)
    dst = h.g.clone(h.x, name="dst")
    gcl.allReduceToDestinationCrossReplica(h.g, h.x, dst, Op.MAX, h.body)
    gcl.allReduceInPlaceCrossReplica(h.g, h.x, Op.ADD, h.body)
    both = poplar.concat([h.x, dst], 0)
    got = h.run(both)
    np.testing.assert_allclose(got[:, :10], _reference(data, "ADD"), rtol=1e-5)
    np.testing.assert_allclose(got[:, 10:], _reference(data, "MAX"))


@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("shape,dtype", [([5], np.float32), ([2, 3], np.float16), ([4], np.int32)])
def test_all_gather_cross_replica(R, shape, dtype):
    data = (np.random.default_rng(4).standard_normal([R] + shape) * 5).astype(dtype)
    h = Rep(data, R)
    out = gcl.allGatherCrossReplica(h.g, h.x, h.body, debug_name="ag")
    assert out.shape() == [R] + shape
    got = h.run(out)
    for r in range(R):
        np.testing.assert_array_equal(got[r], data)
    # each gathered row is mapped like the input
    assert (h.g.tile_of_elements(out).reshape(R, -1) == h.g.tile_of_elements(h.x)).all()


def test_all_gather_orthogonal_group():
    data = np.arange(8 * 2, dtype=np.float32).reshape(8, 2)
    h = Rep(data, 8)
    out = gcl.allGatherCrossReplica(h.g, h.x, h.body, CommGroup(CommGroupType.ORTHOGONAL, 2))
    got = h.run(out)
    for r in range(8):
        np.testing.assert_array_equal(got[r], data[[r % 4, r % 4 + 4]])


def _reduce_scatter_ref(data, p, ipu_of_elem):
    red = data.astype(np.float64).sum(0)
    pieces = [[] for _ in range(p)]
    for j in np.unique(ipu_of_elem):
        seg = red[ipu_of_elem == j]
        m = -(-seg.size // p)
        seg = np.r_[seg, np.zeros(m * p - seg.size)]
        for q in range(p):
            pieces[q].append(seg[q * m:(q + 1) * m])
    return np.stack([np.concatenate(x) for x in pieces])


@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("n,dtype", [(16, np.float32), (13, np.float32), (30, np.float16)])
def test_reduce_scatter_cross_replica(R, n, dtype):
    data = np.random.default_rng(5).standard_normal([R, n]).astype(dtype)
    h = Rep(data, R)
    out = gcl.reduceScatterCrossReplica(h.g, h.x, Op.ADD, h.body)
    assert out.shape() == [-(-n // R)]
    np.testing.assert_allclose(h.run(out), _reduce_scatter_ref(data, R, np.zeros(n, int)), **_tol(dtype, R))


def test_reduce_scatter_groups_results_per_ipu():
    # 2 replicas of 2 IPUs (2 tiles each); elements interleave the replica's IPUs
    R, n = 2, 10
    tiles = np.array([0, 0, 2, 2, 2, 1, 3, 3, 3, 3])          # IPU = tile // 2
    data = np.random.default_rng(6).standard_normal([R, n]).astype(np.float32)
    h = Rep(data, R, tiles=2, ipus_per_replica=2, mapping=tiles)
    out = gcl.reduceScatterCrossReplica(h.g, h.x, Op.ADD, h.body)
    ipu = tiles // 2
    np.testing.assert_allclose(h.run(out), _reduce_scatter_ref(data, R, ipu), rtol=1e-5)
    # the result is grouped per IPU and stays on its IPU
    out_ipu = h.g.tile_of_elements(out) // 2
    assert out_ipu.tolist() == [0, 0, 1, 1, 1, 1]      # ceil(3/2) + ceil(7/2)


def test_reduce_scatter_then_all_gather_is_all_reduce():
    R, n = 4, 12
    data = np.random.default_rng(7).standard_normal([R, n]).astype(np.float32)
    h = Rep(data, R)
    rs = gcl.reduceScatterCrossReplica(h.g, h.x, Op.ADD, h.body)
    ag = gcl.allGatherCrossReplica(h.g, rs, h.body)
    got = h.run(ag)
    np.testing.assert_allclose(got.reshape(R, -1)[:, :n], _reference(data, "ADD"), rtol=1e-5)


# -- within a replica (across the IPUs of one replica) ------------------------------------------
def _within(k=4, tiles=4, n=10, dtype=np.float32):
    dev = _device(k, tiles)
    g = poplar.Graph(dev.getTarget())
    x = g.addVariable(_TYPES[np.dtype(dtype)], [k, n], "x")
    # row i spread over the tiles of IPU i
    g.setTileMapping(x, (np.arange(k)[:, None] * tiles + np.arange(n)[None, :] % tiles).reshape(-1))
    vals = np.random.default_rng(8).standard_normal([k, n]).astype(dtype)
    g.setInitialValue(x, vals)
    return dev, g, x, vals


def _run_single(dev, g, prog, **outs):
    for name, t in outs.items():
        g.createHostRead(name, t)
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.run()
    return e, {name: np.asarray(e.readTensor(name)) for name in outs}


@pytest.mark.parametrize("op", ["ADD", "MAX", "MEAN"])
def test_all_reduce_within_replica(op):
    dev, g, x, vals = _within()
    prog = P.Sequence()
    out = gcl.allReduceWithinReplica(g, x, op, prog, "arw")
    e, res = _run_single(dev, g, prog, out=out)
    np.testing.assert_allclose(res["out"], _reference(vals, op), rtol=1e-5, atol=1e-6)
    assert (g.tile_of_elements(out) == g.tile_of_elements(x)).all()
    assert e.getProfile()["execution"]["tileAverage"]["global_exchange"] > 0


@pytest.mark.parametrize("n", [12, 10, 3])
def test_reduce_scatter_and_all_gather_within_replica(n):
    k = 4
    dev, g, x, vals = _within(k=k, n=n)
    prog = P.Sequence()
    chunks = gcl.reduceScatterWithinReplica(g, x, Op.ADD, prog)
    assert [c.index for c in chunks.chunks] == list(range(k))
    for c in chunks.chunks:          # chunk i lives on IPU i
        assert (g.tile_of_elements(c.tensor) // 4 == c.index).all()
    gathered = gcl.allGatherWithinReplica(g, chunks, prog)
    assert gathered.shape() == [k, n]
    _, res = _run_single(dev, g, prog, out=gathered, c0=chunks.chunks[0].tensor)
    total = vals.sum(0)
    np.testing.assert_allclose(res["c0"], total[: -(-n // k)], rtol=1e-5)
    np.testing.assert_allclose(res["out"], np.broadcast_to(total, (k, n)), rtol=1e-5)
    assert (g.tile_of_elements(gathered).reshape(k, n) // 4 == np.arange(k)[:, None]).all()


def test_within_replica_rejects_rows_on_wrong_ipus():
    dev, g, x, _ = _within()
    y = g.addVariable(poplar.FLOAT, [4, 10], "y")
    g.setTileMapping(y, 0)
    with pytest.raises(poputil.poplibs_error, match="mapped to IPU i"):
        gcl.allReduceWithinReplica(g, y, Op.ADD, P.Sequence())
    with pytest.raises(poputil.poplibs_error, match="outermost dimension"):
        gcl.allReduceWithinReplica(g, x.slice(0, 2, 0), Op.ADD, P.Sequence())


# -- errors ---------------------------------------------------------------------------------------
def test_errors_name_the_problem_and_leave_the_graph_usable():
    data = np.ones([4, 6], np.float32)
    h = Rep(data, 4)
    with pytest.raises(poputil.poplibs_error, match="unknown collective operator"):
        gcl.allReduceCrossReplica(h.g, h.x, "AVERAGE", h.body)
    with pytest.raises(poputil.poplibs_error, match="needs bool operands"):
        gcl.allReduceCrossReplica(h.g, h.x, Op.LOGICAL_AND, h.body)
    with pytest.raises(poputil.poplibs_error, match="does not divide"):
        gcl.allReduceCrossReplica(h.g, h.x, Op.ADD, h.body, CommGroup(CommGroupType.CONSECUTIVE, 3))
    with pytest.raises(poplar.invalid_option, match="Unrecognised GCL option"):
        gcl.allReduceCrossReplica(h.g, h.x, Op.ADD, h.body, None, "x", {"bogus": "1"})
    with pytest.raises(poplar.invalid_option, match="method"):
        gcl.allReduceCrossReplica(h.g, h.x, Op.ADD, h.body, options={"method": "tree"})
    with pytest.raises(poputil.poplibs_error, match="rank 1"):
        gcl.reduceScatterCrossReplica(h.g, h.x.reshape([2, 3]), Op.ADD, h.body)
    unmapped = h.g.addVariable(poplar.FLOAT, [3], "unmapped")
    with pytest.raises(poplar.invalid_tile_mapping, match="not completely mapped"):
        gcl.allReduceCrossReplica(h.g, unmapped, Op.ADD, h.body)
    h.g.setTileMapping(unmapped, 0)
    with pytest.raises(poplar.graph_connection_error, match="shape and type"):
        gcl.allReduceToDestinationCrossReplica(h.g, h.x, unmapped, Op.ADD, h.body)
    out = gcl.allReduceCrossReplica(h.g, h.x, Op.ADD, h.body)      # the graph still works
    np.testing.assert_allclose(h.run(out), np.full([4, 6], 4.0))


def test_executable_with_collectives_serialises():
    h = Rep(np.ones([2, 4], np.float32), 2)
    gcl.allReduceInPlaceCrossReplica(h.g, h.x, Op.ADD, h.body)
    buf = io.BytesIO()
    poplar.compileGraph(h.g, [h.prog]).serialize(buf)
    assert buf.getvalue()


# -- cost -----------------------------------------------------------------------------------------
def _spec(num_ipus=1, tiles=1472, version="ipu2"):
    from openipu import ipu
    return ipu.target(version, num_ipus, tiles_per_ipu=tiles)


def _linear_counts(spec, n, type_=poplar.FLOAT):
    from openipu.poplar.mapping import linear_tile_of_elements
    t = linear_tile_of_elements(n, spec.num_tiles, spec.vector_width(type_.size), -(-128 // type_.size))
    return np.bincount(t, minlength=spec.num_tiles)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_ring_formula_bytes_over_links(p):
    spec = _spec()
    n = 1 << 20
    counts = _linear_counts(spec, n)
    nbytes = 4 * n
    ar = gcl.ring_cost(spec, counts, poplar.FLOAT, p, "allreduce", method="bidirectional_ring_pair")
    rs = gcl.ring_cost(spec, counts, poplar.FLOAT, p, "reducescatter", method="bidirectional_ring_pair")
    ag_counts = -(-counts // p)
    ag = gcl.ring_cost(spec, ag_counts, poplar.FLOAT, p, "allgather", method="bidirectional_ring_pair")
    # all-reduce sends 2(p-1)/p of the bytes, reduce-scatter and all-gather (p-1)/p
    np.testing.assert_allclose(ar.link_bytes[0], 2 * (p - 1) / p * nbytes, rtol=0.01)
    np.testing.assert_allclose(rs.link_bytes[0], (p - 1) / p * nbytes, rtol=0.01)
    np.testing.assert_allclose(ag.link_bytes[0], (p - 1) / p * nbytes, rtol=0.01)
    link_bpc = spec.ipu_link_bytes_per_s / spec.clock_hz
    np.testing.assert_allclose(ar.link_cycles[0], 2 * (p - 1) / p * nbytes / link_bpc, rtol=0.01)
    assert ar.steps == 2 * (p - 1) and rs.steps == p - 1
    # a one-way ring has half the bandwidth
    cw = gcl.ring_cost(spec, counts, poplar.FLOAT, p, "allreduce", method="clockwise_ring")
    np.testing.assert_allclose(cw.link_cycles[0], 2 * ar.link_cycles[0], rtol=1e-9)


def test_all_reduce_cycles_scale_with_bytes():
    spec = _spec()
    pair = "bidirectional_ring_pair"
    c1 = gcl.ring_cost(spec, _linear_counts(spec, 1 << 18), poplar.FLOAT, 8, "allreduce", method=pair)
    c4 = gcl.ring_cost(spec, _linear_counts(spec, 1 << 20), poplar.FLOAT, 8, "allreduce", method=pair)
    assert c4.link_cycles[0] == pytest.approx(4 * c1.link_cycles[0], rel=0.05)   # per-tile fragment rounding
    g1, g4 = c1.cost.duration["global_exchange"][0], c4.cost.duration["global_exchange"][0]
    assert 3.5 < g4 / g1 <= 4.0             # ~4x, less the fixed per-step latency
    # fp16 halves the bytes and the link time
    h4 = gcl.ring_cost(spec, _linear_counts(spec, 1 << 20, poplar.HALF), poplar.HALF, 8, "allreduce", method=pair)
    assert h4.link_cycles[0] == pytest.approx(c4.link_cycles[0] / 2, rel=0.02)
    # auto: latency-bound small tensors take the meet-in-middle ring (fewer steps), large ones the pair
    small = gcl.ring_cost(spec, _linear_counts(spec, 1 << 12), poplar.FLOAT, 8, "allreduce")
    large = gcl.ring_cost(spec, _linear_counts(spec, 1 << 22), poplar.FLOAT, 8, "allreduce")
    assert (small.method, large.method) == ("meet_in_middle_ring", pair)
    assert small.steps == 8 and large.steps == 14


def test_data_on_few_tiles_is_bound_by_tile_exchange():
    spec = _spec()
    n = 1 << 16
    spread = gcl.ring_cost(spec, _linear_counts(spec, n), poplar.FLOAT, 4, "allreduce", method="bidirectional_ring_pair")
    counts = np.zeros(spec.num_tiles, np.int64)
    counts[0] = n
    one = gcl.ring_cost(spec, counts, poplar.FLOAT, 4, "allreduce", method="bidirectional_ring_pair")
    assert one.tile_cycles[0] > one.link_cycles[0] and spread.tile_cycles[0] < spread.link_cycles[0]
    assert one.cost.total()[0] > 5 * spread.cost.total()[0]


def test_gw_links_slow_rings_that_leave_the_pod64():
    spec = _spec()
    counts = _linear_counts(spec, 1 << 20)
    inside = gcl.ring_cost(spec, counts, poplar.FLOAT, 16, "allreduce", ring_ipus=np.arange(16) * 4)
    across = gcl.ring_cost(spec, counts, poplar.FLOAT, 32, "allreduce", ring_ipus=np.arange(32) * 4)
    assert not inside.crosses_gw_links and across.crosses_gw_links
    assert across.link_cycles[0] > 20 * inside.link_cycles[0]


def test_reduce_compute_and_sync_per_step():
    spec = _spec(tiles=16)
    counts = _linear_counts(spec, 4096)
    add = gcl.ring_cost(spec, counts, poplar.FLOAT, 4, "allreduce", "ADD", "bidirectional_ring_pair")
    mean = gcl.ring_cost(spec, counts, poplar.FLOAT, 4, "allreduce", "MEAN", "bidirectional_ring_pair")
    ag = gcl.ring_cost(spec, -(-counts // 4), poplar.FLOAT, 4, "allgather", "ADD", "bidirectional_ring_pair")
    assert add.cost.duration["sync"][0] == 6 * spec.global_sync_cycles
    assert add.cost.duration["compute"][0] > 0 and ag.cost.duration["compute"][0] == 0
    assert mean.cost.duration["compute"][0] > add.cost.duration["compute"][0]
    assert add.cost.flops == pytest.approx(3 * 4096 / 4, rel=0.05)


def test_engine_profile_shows_collective_under_global_exchange():
    cycles = {}
    for n in (4096, 4 * 4096):
        data = np.ones([4, n], np.float32)
        h = Rep(data, 4, tiles=256)
        gcl.allReduceInPlaceCrossReplica(h.g, h.x, Op.ADD, h.body, options={"method": "bidirectional_ring_pair"})
        h.run(h.x)
        prof = h.engine.getProfile()
        cycles[n] = prof["execution"]["tileAverage"]["global_exchange"]
        steps = [s for s in prof["steps"] if s["type"] == "GlobalExchange"]
        assert len(steps) == 1 and steps[0]["cyclesPerIpu"]["global_exchange"][0] == pytest.approx(cycles[n])
        buf = io.StringIO()
        h.engine.printProfileSummary(buf)
        assert "BinaryOp1DInPlace" in buf.getvalue()
    lat = 6 * gcl.IPU_LINK_HOP_LATENCY_S * 1.33e9
    assert (cycles[4 * 4096] - lat) == pytest.approx(4 * (cycles[4096] - lat), rel=0.05)
