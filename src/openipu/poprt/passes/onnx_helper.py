"""``poprt.passes.onnx_helper``: small ONNX graph helpers custom passes use.

- :func:`clean_info`: drop the shape / type annotations of intermediate tensors (``value_info``)
  and re-infer them, so a pass sees annotations that match the graph as it is now.
- :func:`get_dtype` / :func:`get_shape`: the element type / static shape of a tensor of a graph.
- :func:`topological_sort`: the graph's nodes in an order where each node follows its producers.

Source: the call sites in Byte MLPerf's ``backends/IPU/passes`` (``clean_info(model) -> model``,
``get_dtype(graph, name) -> onnx.TensorProto elem type``, ``topological_sort(graph) -> [NodeProto]``);
PopRT's implementation is not public, these are written from those uses.
"""

from __future__ import annotations

import onnx


def clean_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove every ``value_info`` entry of the model's graphs (subgraphs too) and make the symbolic
    (``dim_param``) dimensions of the main graph's outputs unknown, then infer shapes and types again
    (:func:`openipu.poprt.passes.shape_inference.infer_shapes`, which tolerates ``ai.graphcore``
    ops). Graph inputs and outputs keep their types.

    Args:
        model: an ``onnx.ModelProto``; it is modified in place.
    Returns:
        The model with fresh annotations (a new object when inference succeeded, else ``model``).
    """
    from openipu.poprt.passes.shape_inference import infer_shapes

    def clear(g: onnx.GraphProto):
        del g.value_info[:]
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    clear(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        clear(sub)
    clear(model.graph)
    for o in model.graph.output:
        tt = o.type.tensor_type
        if tt.HasField("shape"):
            for d in tt.shape.dim:
                if d.dim_param:
                    d.Clear()               # unknown, for inference to fill (the rank stays)
    return infer_shapes(model)


def _value_infos(graph: onnx.GraphProto):
    yield from graph.input
    yield from graph.output
    yield from graph.value_info


def get_dtype(graph: onnx.GraphProto, name: str) -> int:
    """The ONNX element type (``onnx.TensorProto.FLOAT`` ...) of tensor ``name`` of ``graph``: an
    initializer's data type, or the type of a graph input / output / ``value_info`` entry.

    Raises:
        KeyError: ``graph`` has no type for ``name`` (run shape inference first).
    """
    for t in graph.initializer:
        if t.name == name:
            return int(t.data_type)
    for vi in _value_infos(graph):
        if vi.name == name and vi.type.tensor_type.elem_type:
            return int(vi.type.tensor_type.elem_type)
    for n in graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    return int(a.t.data_type)
    raise KeyError(f"No element type is known for tensor '{name}' (run shape inference first)")


def get_shape(graph: onnx.GraphProto, name: str) -> list:
    """The shape of tensor ``name`` of ``graph`` as a list (ints, or the symbolic name of a
    dimension as a str, or None when unknown).

    Raises:
        KeyError: ``graph`` has no shape for ``name``.
    """
    for t in graph.initializer:
        if t.name == name:
            return list(t.dims)
    for vi in _value_infos(graph):
        tt = vi.type.tensor_type
        if vi.name == name and tt.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    raise KeyError(f"No shape is known for tensor '{name}' (run shape inference first)")


def topological_sort(graph: onnx.GraphProto) -> list:
    """The nodes of ``graph`` (the objects themselves) ordered so that every node comes after the
    nodes producing its inputs; ties keep the graph's order. Names a subgraph reads from the outer
    scope count as inputs of the node holding it.

    Raises:
        ValueError: the graph has a cycle.
    """
    nodes = list(graph.node)
    producer = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = i

    def reads(n):
        names = set(x for x in n.input if x)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                names |= _outer(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    names |= _outer(g)
        return names

    deps = [{producer[x] for x in reads(n) if x in producer and producer[x] != i} for i, n in enumerate(nodes)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    left = [len(d) for d in deps]
    import heapq
    ready = [i for i, k in enumerate(left) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            left[u] -= 1
            if left[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i, k in enumerate(left) if k][:5]
        raise ValueError(f"The graph '{graph.name}' has a cycle (nodes {stuck} never become ready)")
    return [nodes[i] for i in order]


def _outer(g: onnx.GraphProto) -> set:
    inner = {i.name for i in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    out = set()
    for n in g.node:
        out |= {x for x in n.input if x and x not in inner}
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= _outer(a.g) - inner
    return out


__all__ = ["clean_info", "get_dtype", "get_shape", "topological_sort"]
