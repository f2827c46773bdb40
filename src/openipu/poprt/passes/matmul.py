"""MatMul rewrites of PopRT's command line: ``serialize_matmul``, ``serialize_matmul_add``,
``merge_matmul`` and ``merge_matmul_add``.

- **Serialize** (``--serialize_matmul NAME=FACTOR/MODE``): one ``MatMul`` ``A[..., M, K] @ B[K, N]``
  becomes ``FACTOR`` smaller ones, as PopART's serialised matmul (``Builder.setSerializeMatMul``)
  runs it: ``output_channels`` splits ``B``'s columns (``N``) and concatenates the results;
  ``input_channels`` splits ``A``'s rows (``M``) and concatenates; ``reducing_dim`` splits ``K``
  and sums the partial products. Each part needs a ``FACTOR``-th of the temporary memory (the
  point of serialising on a 624 KiB tile) and runs one after the other. ``serialize_matmul_add``
  does the same for a ``MatMul`` followed by the ``Add`` of a constant bias (the bias is split with
  the columns, or added once after the sum).
- **Merge** (``--merge_matmul N1,N2,...``): ``MatMul`` nodes that read the same input with
  constant ``[K, N_i]`` weights (e.g. attention's Q, K and V projections) become one ``MatMul``
  with the weights concatenated (``[K, sum N_i]``) followed by a ``Split``: one bigger matmul
  uses the tiles better than several small ones. ``merge_matmul_add`` also merges their bias
  ``Add`` nodes.

The result is plain ONNX (onnxruntime runs it); shapes come from ONNX shape inference.
"""

from __future__ import annotations

import numpy as np
import onnx

from openipu.poprt.passes.base import GraphView, Pass, PassError, opset_of, prune_unused, register, remove_nodes

MODES = ("output_channels", "input_channels", "reducing_dim")


def _shapes(model):
    from openipu.poprt.passes.attention import _shapes as shapes
    return shapes(model)


def _find(model, name: str, what: str) -> onnx.NodeProto:
    for n in model.graph.node:
        if n.name == name or (n.output and n.output[0] == name):
            if n.op_type != "MatMul" or n.domain not in ("", "ai.onnx"):
                raise PassError(f"{what}: node '{name}' is a {n.op_type}, not a MatMul")
            return n
    raise PassError(f"{what}: the model has no MatMul named '{name}'")


def _split_node(gv, model, x: str, axis: int, sizes: list[int], outs: list[str]) -> onnx.NodeProto:
    if opset_of(model) >= 13:
        s = gv.add_init("split_sizes", np.array(sizes, np.int64))
        return onnx.helper.make_node("Split", [x, s], outs, name=gv.fresh("Split_" + x), axis=axis)
    return onnx.helper.make_node("Split", [x], outs, name=gv.fresh("Split_" + x), axis=axis, split=sizes)


def parse_serialize(spec) -> dict:
    """``{matmul name: (factor, mode)}`` from ``{name: 'FACTOR[/MODE]'}`` or ``['NAME=FACTOR[/MODE]', ...]``.

    Raises:
        PassError: a malformed entry, a factor below 1, or an unknown mode.
    """
    items = spec.items() if isinstance(spec, dict) else [str(s).split("=", 1) if "=" in str(s) else (s, None)
                                                         for s in (spec or [])]
    out = {}
    for name, val in items:
        if val is None:
            raise PassError(f"serialize_matmul: expected NAME=FACTOR[/MODE], got {name!r}")
        parts = str(val).split("/")
        try:
            factor = int(parts[0])
        except ValueError:
            raise PassError(f"serialize_matmul: the factor of '{name}' must be an integer, got {parts[0]!r}") from None
        mode = parts[1] if len(parts) > 1 and parts[1] else "output_channels"
        if len(parts) > 2 and parts[2].lower() in ("true", "1"):
            raise PassError(f"serialize_matmul: keep_precision for '{name}' is not supported (the partial products "
                            f"are in the MatMul's own type; set partials_type=float instead)")
        if factor < 1:
            raise PassError(f"serialize_matmul: the factor of '{name}' must be at least 1, got {factor}")
        if mode not in MODES:
            raise PassError(f"serialize_matmul: unknown mode '{mode}' for '{name}'; use one of {', '.join(MODES)}")
        out[str(name)] = (factor, mode)
    return out


class _Serialize(Pass):
    with_add = False

    def run(self, model):
        spec = parse_serialize(self.kwargs.get("config", self.args[0] if self.args else {}))
        what = self.name
        shapes = _shapes(model)
        for name, (factor, mode) in spec.items():
            mm = _find(model, name, what)
            if factor == 1:
                continue
            gv = GraphView(model.graph)
            a, b = mm.input[0], mm.input[1]
            sa, sb = shapes.get(a), shapes.get(b)
            if sa is None or sb is None or len(sb) < 2 or len(sa) < 2:
                raise PassError(f"{what}: the shapes of '{name}''s operands are not known (give --input_shape)")
            add, bias = None, None
            if self.with_add:
                add = gv.single_consumer(mm.output[0])
                if add is None or add.op_type != "Add":
                    raise PassError(f"{what}: MatMul '{name}' is not followed by an Add")
                other = add.input[1] if add.input[0] == mm.output[0] else add.input[0]
                bias = gv.const(other)
                if bias is None:
                    raise PassError(f"{what}: the Add after '{name}' does not add a constant bias")
            dim = {"output_channels": sb[-1], "input_channels": sa[-2], "reducing_dim": sa[-1]}[mode]
            if factor > dim:
                raise PassError(f"{what}: '{name}' has {dim} {mode.replace('_', ' ')}; cannot split it {factor} ways")
            sizes = [len(c) for c in np.array_split(np.arange(dim), factor)]
            nodes: list = []
            out_name = add.output[0] if add is not None else mm.output[0]
            bconst = gv.const(b)

            def parts_of(x, axis, const):
                if const is not None:
                    return [gv.add_init(f"{x}_part", np.ascontiguousarray(c))
                            for c in np.split(const, np.cumsum(sizes)[:-1], axis=axis)]
                outs = [gv.fresh(f"{x}_part") for _ in sizes]
                nodes.append(_split_node(gv, model, x, axis, sizes, outs))
                return outs
            if mode == "output_channels":
                a_parts, b_parts = [a] * factor, parts_of(b, -1, bconst)
            elif mode == "input_channels":
                a_parts, b_parts = parts_of(a, len(sa) - 2, None), [b] * factor
            else:
                a_parts, b_parts = parts_of(a, len(sa) - 1, None), parts_of(b, len(sb) - 2, bconst)
            prods = []
            for i, (x, w) in enumerate(zip(a_parts, b_parts)):
                y = gv.fresh(f"{mm.output[0]}_serial{i}")
                nodes.append(onnx.helper.make_node("MatMul", [x, w], [y], name=gv.fresh(f"{mm.name or 'MatMul'}_serial{i}")))
                if bias is not None and (mode != "reducing_dim" or i == 0):
                    if mode == "output_channels" and bias.ndim and bias.shape[-1] == dim:
                        bpart = np.split(bias, np.cumsum(sizes)[:-1], axis=-1)[i]
                    else:
                        bpart = bias
                    yb = gv.fresh(f"{y}_bias")
                    nodes.append(onnx.helper.make_node("Add", [y, gv.add_init(f"{y}_b", np.ascontiguousarray(bpart))], [yb]))
                    y = yb
                prods.append(y)
            if mode == "reducing_dim":
                nodes.append(onnx.helper.make_node("Sum", prods, [out_name], name=gv.fresh(f"{name}_serial_sum")))
            else:
                axis = -1 if mode == "output_channels" else -2
                nodes.append(onnx.helper.make_node("Concat", prods, [out_name], name=gv.fresh(f"{name}_serial_concat"),
                                                   axis=axis))
            dead = [mm] + ([add] if add is not None else [])
            remove_nodes(model.graph, dead, [(n, dead[-1]) for n in nodes])
            self.applied.append(name)
        if self.applied:
            prune_unused(model.graph)
        return model


@register("serialize_matmul")
class SerializeMatMul(_Serialize):
    """Split the named ``MatMul`` nodes into ``factor`` serial parts (``config={name: 'FACTOR/MODE'}``;
    modes ``output_channels`` (default), ``input_channels``, ``reducing_dim``)."""


@register("serialize_matmul_add")
class SerializeMatMulAdd(_Serialize):
    """``serialize_matmul`` for a ``MatMul`` followed by a constant bias ``Add``, the bias split with it."""
    with_add = True


def parse_groups(spec) -> list[list[str]]:
    """``[[name, ...], ...]`` from ``'A,B,C;D,E'`` (groups separated by ``;``) or a list of lists."""
    if isinstance(spec, str):
        groups = [[s.strip() for s in g.split(",") if s.strip()] for g in spec.split(";")]
    else:
        groups = [list(g) if not isinstance(g, str) else [g] for g in (spec or [])]
    groups = [g for g in groups if g]
    for g in groups:
        if len(g) < 2:
            raise PassError(f"merge_matmul: a group needs at least two MatMul names, got {g}")
    return groups


class _Merge(Pass):
    with_add = False

    def run(self, model):
        what = self.name
        for group in parse_groups(self.kwargs.get("groups", self.args[0] if self.args else [])):
            gv = GraphView(model.graph)
            mms = [_find(model, n, what) for n in group]
            srcs = {m.input[0] for m in mms}
            if len(srcs) != 1:
                raise PassError(f"{what}: {group} do not read the same input (they read {sorted(srcs)})")
            ws = [gv.const(m.input[1]) for m in mms]
            if any(w is None or w.ndim != 2 for w in ws) or len({w.shape[0] for w in ws}) != 1:
                raise PassError(f"{what}: {group} need constant 2-D weights with the same number of rows")
            outs, adds, biases = [m.output[0] for m in mms], [], []
            if self.with_add:
                for m, w in zip(mms, ws):
                    add = gv.single_consumer(m.output[0])
                    other = None if add is None or add.op_type != "Add" else \
                        (add.input[1] if add.input[0] == m.output[0] else add.input[0])
                    b = gv.const(other) if other else None
                    if b is None or b.shape not in ((w.shape[1],), (1, w.shape[1])):
                        raise PassError(f"{what}: MatMul '{m.name or m.output[0]}' is not followed by the Add of a "
                                        f"[{w.shape[1]}] bias")
                    adds.append(add)
                    biases.append(b.reshape(-1))
                outs = [a.output[0] for a in adds]
            dtype = ws[0].dtype
            w = gv.add_init("merged_weight", np.concatenate(ws, axis=1).astype(dtype))
            y = gv.fresh(f"{mms[0].output[0]}_merged")
            nodes = [onnx.helper.make_node("MatMul", [srcs.pop(), w], [y], name=f"MergedMatMul_{y}")]
            if self.with_add:
                yb = gv.fresh(f"{y}_bias")
                nodes.append(onnx.helper.make_node("Add", [y, gv.add_init("merged_bias", np.concatenate(biases).astype(
                    biases[0].dtype))], [yb]))
                y = yb
            nodes.append(_split_node(gv, model, y, -1, [wt.shape[1] for wt in ws], outs))
            dead = mms + adds
            first = next(n for n in model.graph.node if any(n is d for d in dead))
            remove_nodes(model.graph, dead, [(n, first) for n in nodes])
            self.applied.append(",".join(group))
        if self.applied:
            prune_unused(model.graph)
        return model


@register("merge_matmul")
class MergeMatMul(_Merge):
    """Merge ``MatMul`` nodes that share an input and have constant weights (``groups='A,B,C;D,E'``)
    into one ``MatMul`` and a ``Split``."""


@register("merge_matmul_add")
class MergeMatMulAdd(_Merge):
    """``merge_matmul`` for ``MatMul`` + constant bias ``Add`` pairs: one ``MatMul``, one ``Add``, a ``Split``."""
    with_add = True
