"""Costs of copies between tensors (predicted IPU cycles; the host work is the compile's): the
on-tile copy and the exchange of a ``Copy`` program, and host stream copies. Part of the graph
compiler (:mod:`openipu.poplar.graph_compiler`), whose ``_Compiler`` takes these methods from
:class:`_CopyCosts`; split out of it along that family.

A copy's cost is its sync, its exchange (the elements of the source that are not on the tile of
the destination element they go to, costed by :func:`openipu.poplar.cost.exchange_volume`) and
the on-tile copies of the rest. Two short cuts give the same figures with less host work: a copy
whose elements all stay on their tiles is an on-tile copy (:func:`_same_tiles`), and a small copy
whose exchange the per-element model costs counts the elements that move from the tiles of its
elements, not from the transfer's lattice moves.
"""

from __future__ import annotations

import hashlib

import numpy as np

from openipu.poplar import calibration as cal
from openipu.poplar import cost as costmod
from openipu.poplar import exchange as X
from openipu.poplar import exchange_moves as XM
from openipu.poplar import regions as R
from openipu.poplar import sets as _sets
from openipu.poplar import structure_cache as SC
from openipu.poplar.tensor import Tensor


def _alike_layout(s: Tensor, d: Tensor):
    """When ``s`` and ``d`` are each all of one variable (two different variables of one type) in
    memory order, with the same run-length tile maps: ``(elements, tile)`` per run (float64,
    int64); else None. Compares run lists, never elements."""
    rs, rd = s.pieces.row, d.pieces.row
    if rs is None or rd is None or rs[0] == rd[0] or s._type != d._type or s._state is not d._state:
        return None
    out = []
    for v, addr, _, sz, st in (rs, rd):
        var = s._state.variables[v]
        if addr != var.start or var.numel != int(np.prod(sz, dtype=np.int64)) or not R._dense(sz, st):
            return None
        out.append(var)
    a, b = out
    if not (np.array_equal(a.tile_starts, b.tile_starts) and np.array_equal(a.tile_ids, b.tile_ids)) or (a.tile_ids < 0).any():
        return None
    begin, end, tile = a.tile_runs()
    return (end - begin).astype(np.float64), tile.astype(np.int64)


#: copies of at most this many elements compare their elements' tiles one by one (:func:`_same_tiles`)
SAME_TILES_MAX_ELEMENTS = 1 << 16


def _same_tiles(s: Tensor, d: Tensor, max_elements: int = SAME_TILES_MAX_ELEMENTS):
    """Whether element ``i`` of ``s`` lives on the same tile as element ``i`` of ``d`` for every
    ``i`` (a copy between tensors laid out alike: nothing to exchange). Sufficient tests only:
    the two views are the same structure over variables mapped alike (their structure-memo keys
    are equal, so their tile boxes are); or, for views of at most ``max_elements``, their
    elements' tiles compared one by one. Returns ``(same, tiles)``: ``same`` False means "not
    shown"; ``tiles`` is ``(tiles of s, tiles of d)`` per element (int arrays in row-major order)
    when they were compared one by one, else None."""
    if tuple(s.shape()) != tuple(d.shape()):
        return False, None
    rs, rd = s.pieces.row, d.pieces.row
    if rs is not None and rd is not None:
        # one piece each: the structure-memo keys' comparison, without building them
        same = _same_row_layout(s, rs, d, rd)
    else:
        same = len(s.pieces) and len(d.pieces) and SC.view_key(b"", s, True)[0] == SC.view_key(b"", d, True)[0]
    if same:
        return True, None
    if s.numElements() > max_elements:
        return False, None
    ts = s._state.space(s._type).tiles_of(s.flat_addresses())
    td = d._state.space(d._type).tiles_of(d.flat_addresses())
    return bool(np.array_equal(ts, td)), (ts, td)


def _same_row_layout(s: Tensor, rs: tuple, d: Tensor, rd: tuple) -> bool:
    """Whether two one-piece views (their :attr:`regions.Pieces.row`) lie alike over variables
    of one size mapped alike: the same box and strides at the same offset into their variables,
    and the same run-length tile maps (what their structure-memo keys compare)."""
    if rs[2:] != rd[2:]:
        return False
    vs, vd = s._state.variables[rs[0]], d._state.variables[rd[0]]
    if rs[1] - vs.start != rd[1] - vd.start:
        return False
    ms = SC.mapping_token(s._state.space(s._type).vars[vs.space_index])
    md = SC.mapping_token(d._state.space(d._type).vars[vd.space_index])
    return ms == md


def _monotone_pieces(t: Tensor) -> bool:
    """Whether every piece of ``t`` is a monotone lattice (:func:`exchange.monotone`): then so is
    every box of it, and :func:`exchange_moves.transfer_pairs` of a read of ``t`` is never
    ``"elements"``."""
    p = t.pieces
    if len(p) == 0 or not t.rank():
        return True
    _, T, n = R.canonical(p.addr, p.sz, p.st)
    return bool(X.monotone(T, n).all())


class _CopyCosts:
    """The copy-costing methods of the graph compiler (``spec``, ``state``, ``exchange_code``,
    ``occurrence_code``, ``layout_copy_cache`` and ``_var_digests`` are the compiler's)."""

    def bytes_per_ipu(self, t: Tensor) -> np.ndarray:
        """Bytes of ``t`` held on each IPU (float64 ``[num_ipus]``)."""
        spec = self.spec
        counts = X.tile_counts(t, spec.num_tiles)
        return counts.reshape(spec.num_ipus, spec.tiles_per_ipu).sum(axis=1) * float(t.elementType().size)

    def host_copy_cost(self, t: Tensor) -> costmod.StepCost:
        spec = self.spec
        per_ipu = self.bytes_per_ipu(t)
        involved = per_ipu > 0
        c = costmod.sync_cost(spec, involved)
        c.add(costmod.host_cost(spec, per_ipu))
        vol = costmod.exchange_volume(spec, [X.RegionTransfer(t, X.Boxes.whole(t.shape(), -2), to_owner=True)])
        code = vol.code_units() * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
        self.exchange_code += code
        self.occurrence_code += code
        c.add(costmod.exchange_cost(spec, vol))
        return c

    def _var_digest(self, v: int) -> bytes:
        """A digest of variable ``v``'s size and run-length tile map (memoised: the mapping is
        final once the graph is compiled)."""
        k = self._var_digests.get(v)
        if k is None:
            var = self.state.variables[v]
            h = hashlib.blake2b(np.int64(var.numel).tobytes(), digest_size=16)
            h.update(var.tile_starts.tobytes())
            h.update(var.tile_ids.tobytes())
            k = self._var_digests[v] = h.digest()
        return k

    def _layout_key(self, t: Tensor):
        """What a copy's cost depends on in ``t``: its type and shape, and per piece the tile map of
        its variable and where in that variable the piece lies (never the variables themselves)."""
        p = t.pieces
        if p.row is not None:
            v, addr, lo, sz, st = p.row
            return (t._type.space, self._var_digest(v), addr - self.state.variables[v].start, lo, sz, st)
        # per distinct variable (a view of many pieces has few variables): its digest and start;
        # the pieces name them by their index among the distinct ones
        uniq = _sets.unique(p.var)
        which = np.searchsorted(uniq, p.var)
        ids = uniq.tolist()
        starts = np.array([self.state.variables[v].start for v in ids], np.int64)
        return (t._type.space, tuple(t.shape()), tuple(self._var_digest(v) for v in ids), which.tobytes(),
                (p.addr - starts[which]).tobytes(), p.lo.tobytes(), p.sz.tobytes(), p.st.tobytes())

    def layout_copy_cost(self, s: Tensor, d: Tensor) -> costmod.StepCost:
        """:meth:`tensor_copy_cost`, computed once per pair of layouts: copies between other
        variables laid out alike (a subgraph's inputs and outputs at each call site, a layer's
        weights into the subgraph's) cost the same and add the same exchange code."""
        if s._state is not d._state or _sets.intersects(s.pieces.var, d.pieces.var):
            return self.tensor_copy_cost(s, d)          # a copy within one variable: not by layout
        key = (self._layout_key(s), self._layout_key(d))
        hit = self.layout_copy_cache.get(key)
        if hit is None:
            before = self.exchange_code.copy()
            c = self.tensor_copy_cost(s, d)
            hit = self.layout_copy_cache[key] = (c, self.exchange_code - before)
            return c
        self.exchange_code += hit[1]
        return hit[0]

    def tensor_copy_cost(self, s: Tensor, d: Tensor) -> costmod.StepCost:
        """The cost of copying ``s`` into ``d`` (exchange, on-tile copy, sync); adds its exchange code."""
        spec = self.spec
        T = spec.num_tiles
        alike = _alike_layout(s, d)
        if alike is not None:
            # two whole variables in memory order, mapped alike (a copy into a clone of the
            # source, a subgraph's inputs and outputs): every element stays on its tile
            held = np.bincount(alike[1], weights=alike[0], minlength=T)
            c = costmod.sync_cost(spec, costmod.ipus_of_tiles(spec, held > 0))
            c.add(costmod.on_tile_copy_cost(spec, held * float(s.elementType().size)))
            return c
        overlap = s._type == d._type and s._state is d._state and s.intersectsWith(d)
        same, tiles = (False, None) if overlap else _same_tiles(s, d)
        if same:
            # every element stays on its tile: an on-tile copy, no exchange (what the moves below
            # come to for such a pair, without computing them)
            held = X.tile_counts(d, T)
            c = costmod.sync_cost(spec, costmod.ipus_of_tiles(spec, held > 0))
            c.add(costmod.on_tile_copy_cost(spec, held * float(s.elementType().size)))
            return c
        d_boxes = X.tile_boxes(d)
        nel = np.prod(d_boxes.sz, axis=1) if d_boxes.sz.shape[1] else np.ones(len(d_boxes), np.int64)
        ok = d_boxes.tile >= 0
        held = np.bincount(d_boxes.tile[ok], weights=nel[ok], minlength=T)      # tile_counts(d, T)
        tr = X.RegionTransfer(s, d_boxes)
        if tiles is not None and costmod.per_element_model(tr) and _monotone_pieces(s):
            # a small copy whose exchange the per-element model costs (the boxes are small): the
            # elements that change tile counted from the tiles compared above, not from the
            # transfer's lattice moves (the same counts: :func:`exchange_moves.moved_elements`)
            ts, td = tiles
            mv = (ts != td) & (td >= 0)
            moved = np.bincount(td[mv], minlength=T).astype(np.float64)
            vol = costmod.exchange_volume(spec, [tr])
            on_tile = np.maximum(held - moved, 0) * float(s.elementType().size)
            self.exchange_code += vol.code_units() * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
            src_held = np.bincount(ts[ts >= 0], minlength=T) > 0
            c = costmod.sync_cost(spec, costmod.ipus_of_tiles(spec, src_held | (held > 0)))
            c.add(costmod.exchange_cost(spec, vol))
            c.add(costmod.on_tile_copy_cost(spec, on_tile))
            return c
        # the moves are computed once for both the on-tile part and the exchange (a copy of a
        # large activation has too many for the structure memo to keep)
        pairs = XM.transfer_pairs(tr)
        moved = XM.moved_elements(tr, T, pairs)
        if moved is None or overlap:
            # a copy onto itself or an overlapping view: per element (small, rare)
            ss, ds = self.state.space(s._type), self.state.space(d._type)
            sa, da = s.flat_addresses(), d.flat_addresses()
            st_, dt_ = ss.tiles_of(sa).astype(np.int64), ds.tiles_of(da).astype(np.int64)
            local = (st_ == dt_) & (sa != da)
            on_tile = np.bincount(dt_[local], minlength=T) * float(s.elementType().size)
            vol = costmod.exchange_volume(spec, [costmod.Transfer(ss, sa, dt_)])
        else:
            vol = costmod.exchange_volume(spec, [tr], [pairs])
            on_tile = np.maximum(held - moved, 0) * float(s.elementType().size)
        self.exchange_code += vol.code_units() * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
        mask = (X.tile_counts(s, T) > 0) | (held > 0)
        involved = costmod.ipus_of_tiles(spec, mask)
        c = costmod.sync_cost(spec, involved)
        c.add(costmod.exchange_cost(spec, vol))
        c.add(costmod.on_tile_copy_cost(spec, on_tile))
        return c
