"""Changing the batch size of an exported model (PopRT's converter ``--batch_size``).

Setting the first dimension of the run-time inputs is enough for a model whose shapes are
computed (``Shape`` -> ... -> ``Reshape``, as exports with a dynamic batch have them): the
importer folds those chains for the new batch. Exporters that traced a fixed batch ``B0`` bake it
into constants instead. :func:`set_batch_size` follows the batch through such a model:

1. it walks the nodes in order twice over, once with the exported shapes (batch ``B0``) and once
   with the new ones (batch ``B``), keeping the values of small constant tensors and of shape
   arithmetic (``Shape``, ``Gather``, ``Concat`` ... of constants) on both walks;
2. before a node of the new walk runs, its constant inputs that hard-code ``B0`` are given new
   constants (fresh initializers for that node alone; the originals are left to other users):

   - ``Reshape``: the target shape is realigned. The input dimension whose size changed holds
     the batch as its outermost factor; the output dimension that starts at the same flat
     position gets it (``[40, 16, -1, 32]`` -> ``[4, 16, 2, 32]``; ``[2, 16, 32]`` of a batch-1
     export, heads merged into the batch, -> ``[8, 16, 32]``);
   - ``Expand``: output dimensions whose input dimension changed follow it;
   - broadcasting elementwise ops (``Add``, ``Mul``, ``Where`` ...): a constant operand whose
     dimension equals the old batch-carrying one is resized along it: slices that are all
     equal are repeated, integer slices in arithmetic progression (``arange``-built batch
     indices) are continued; anything else holds per-sample data, which cannot be extended
     (error);
   - ``Concat``: a constant operand (a class token expanded to the batch ...) is resized the
     same way along the dimensions where the other operands' batch changed;
   - ``GatherElements`` of a constant (a buffer expanded to the batch) with batch-carrying
     indices: the constant is resized along the indices' batch dimension;
   - ``Gather`` / ``GatherND`` with constant indices into a batch-carrying axis (the batch
     indices of an ``index_put`` / vmap-style mask): the indices are continued along their
     batch axis with the batch's stride;
   - ``Slice`` of a batch-carrying axis to its old end: to the new end.
3. a node that ran with the exported shapes but cannot run with the new ones (or an operand
   that holds per-sample constants) is a ``ValueError`` naming the node and suggesting a
   re-export with a dynamic batch.

Assumption [A]: the batch is the first dimension of every run-time input and the outermost
factor of any dimension it is merged into. With ``B0 = 1`` (the default of exporters tracing one
example) a dimension of size 1 cannot be told from the batch by its size: the outermost
candidate is taken.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import onnx
import torch
from onnx import numpy_helper

#: tensors up to this many elements keep their values during the walk
VALUE_LIMIT = 1 << 16
#: constants up to this many elements may be resized along the batch
RESIZE_LIMIT = 1 << 24

_BROADCAST_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "LessOrEqual", "Greater",
                  "GreaterOrEqual", "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean", "BitShift",
                  "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"}
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
            "Dropout"}


class _T:
    """What the walk knows of a tensor: ONNX element type, static shape (or None), whether it is
    a constant (folded by the importer), and its value (constants and shape arithmetic, if small).

    A constant computed by the walk that is larger than :data:`VALUE_LIMIT` (a ``Gather`` of an
    embedding table by constant indices, expanded to the batch) keeps how to compute it
    (``make(limit)``) instead of its value: :meth:`value` with a larger limit computes it again
    from its inputs' values, uncached, so a resize can see it without the walk holding it."""

    __slots__ = ("dtype", "shape", "const", "_value", "_proto", "_make")

    def __init__(self, dtype, shape, const=False, value=None, proto=None, make=None):
        self.dtype, self.shape, self.const, self._value, self._proto = dtype, shape, const, value, proto
        self._make = make

    def value(self, limit=VALUE_LIMIT):
        if self._value is None and self.shape is not None and math.prod(self.shape) <= limit:
            if self._proto is not None:
                self._value = numpy_helper.to_array(self._proto)
            elif self._make is not None and limit > VALUE_LIMIT:
                return self._make(limit)
        return self._value


def _static(vi):
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return None if any(d is None for d in dims) else dims


def _broadcast(*shapes):
    r = max(len(s) for s in shapes)
    out = []
    for j in range(r):
        ds = {s[len(s) - r + j] for s in shapes if len(s) - r + j >= 0} - {1}
        if len(ds) > 1:
            return None
        out.append(ds.pop() if ds else 1)
    return out


class _Walker:
    def __init__(self, model: onnx.ModelProto, old_batch: int, batch: int):
        self.m, self.B0, self.B = model, old_batch, batch
        self.opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in model.opset_import}
        self.new_inits: list[onnx.TensorProto] = []
        self._names = {t.name for t in model.graph.initializer}
        self.errors: list[str] = []

    # -- evaluation of one node in one environment ------------------------------------------
    def eval(self, node, env) -> list | None:
        from openipu.popart.graphcore_ops import find_kernel
        from openipu.popart.onnx_ops._reference import to_numpy
        from openipu.popart.shapes import call_kernel, decode_attrs, to_torch

        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = self.opsets.get(domain, 1)
        ins = [env.get(x) if x else None for x in node.input]
        if any(x and t is None for x, t in zip(node.input, ins)):
            return None
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None                      # subgraphs: not followed
        kernel = find_kernel(domain, node.op_type)
        attrs = None
        if domain == "" and node.op_type in ("Shape", "Size") and ins[0].shape is not None:
            shape = ins[0].shape
            if node.op_type == "Size":
                return [_T(onnx.TensorProto.INT64, [], True, np.array(math.prod(shape), np.int64))]
            attrs = decode_attrs(node)
            r = len(shape)
            s, e = int(attrs.get("start", 0)), int(attrs.get("end", r))
            s, e = (s + r if s < 0 else s), (e + r if e < 0 else e)
            v = np.array(shape[max(0, s):min(r, e)], np.int64)
            return [_T(onnx.TensorProto.INT64, list(v.shape), True, v)]
        if any(t is not None and t.shape is None for t in ins):
            return None
        const = node.op_type not in _NO_FOLD and all(t is None or t.const for t in ins)
        make = None
        if kernel is not None and (const or node.op_type == "Constant"):
            def make(limit, k=None):
                """The outputs' values with inputs up to ``limit`` elements (output ``k``
                only if given); None if an input's value is not known."""
                vals = [None if t is None else t.value(limit) for t in ins]
                if not all(v is not None or t is None for v, t in zip(vals, ins)):
                    return None
                attrs = decode_attrs(node)
                attrs["__num_outputs__"] = len(node.output)
                with torch.no_grad():
                    outs = call_kernel(kernel, [None if v is None else to_torch(v) for v in vals], attrs, opset)
                outs = [to_numpy(o) for o in outs]
                return outs if k is None else outs[k]

            outs = make(VALUE_LIMIT)
            if outs is not None:
                return [_T(onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape), True,
                           a if a.size <= VALUE_LIMIT else None, make=partial(make, k=k))
                        for k, a in enumerate(outs)]
        shapes = self._infer(node, domain, opset, ins)
        if shapes is None and kernel is not None:
            shapes = self._probe(node, kernel, opset, ins)
        if shapes is None:
            return None
        return [None if s is None else _T(dt, s, const, make=None if make is None else partial(make, k=k))
                for k, (dt, s) in enumerate(shapes)]

    def _infer(self, node, domain, opset, ins):
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, domain)
            types = {x: onnx.helper.make_tensor_type_proto(t.dtype, t.shape)
                     for x, t in zip(node.input, ins) if x and t is not None}
            data = {}
            for x, t in zip(node.input, ins):
                if x and t is not None and t.const and t.dtype in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                    v = t.value()
                    if v is not None:
                        data[x] = numpy_helper.from_array(np.asarray(v), x)
            out = onnx.shape_inference.infer_node_outputs(
                schema, node, types, data, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in self.opsets.items()])
        except Exception:  # noqa: BLE001 - no schema, or inference refuses: the kernel is asked
            return None
        res = []
        for o in node.output:
            if not o:
                res.append(None)
                continue
            tp = out.get(o)
            if tp is None or not tp.HasField("tensor_type"):
                return None
            tt = tp.tensor_type
            if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
                return None
            res.append((tt.elem_type, [d.dim_value for d in tt.shape.dim]))
        return res

    def _probe(self, node, kernel, opset, ins):
        from openipu.popart.shapes import KERNEL_TORCH_OF, NAME_OF_TORCH, call_kernel, decode_attrs, to_torch
        from openipu.popart.tensorinfo import NAME_OF_ONNX, ONNX_OF

        attrs = decode_attrs(node)
        attrs["__num_outputs__"] = len(node.output)
        for device in ("meta", "cpu"):
            if device == "cpu" and sum(math.prod(t.shape) for t in ins if t is not None) > VALUE_LIMIT * 16:
                return None
            vals = []
            for t in ins:
                v = None if t is None else t.value()
                if t is None:
                    vals.append(None)
                elif v is not None:
                    vals.append(to_torch(v))
                else:
                    dt = KERNEL_TORCH_OF.get(NAME_OF_ONNX.get(t.dtype, "FLOAT"), torch.float32)
                    vals.append(torch.zeros(t.shape, dtype=dt, device=device))
            try:
                with torch.no_grad():
                    outs = call_kernel(kernel, vals, attrs, opset)
                return [(ONNX_OF.get(NAME_OF_TORCH.get(o.dtype, "FLOAT"), 1), list(o.shape)) for o in outs]
            except Exception:  # noqa: BLE001
                continue
        return None

    # -- rules ------------------------------------------------------------------------------
    def _const_input(self, node, i, value, stem):
        """Point input ``i`` of ``node`` at a new initializer holding ``value``."""
        base = f"{node.input[i] or stem}__batch{self.B}"
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        self.new_inits.append(numpy_helper.from_array(np.ascontiguousarray(value).reshape(np.shape(value)), name))
        node.input[i] = name
        return _T(onnx.helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), list(np.shape(value)), True,
                  np.asarray(value))

    def follow(self, node, old_env, new_env, old_outs) -> None:
        """Give ``node`` (of the new model) new constants where it hard-codes the old batch."""
        if node.domain not in ("", "ai.onnx"):
            return
        op = node.op_type
        old = [old_env.get(x) if x else None for x in node.input]
        new = [new_env.get(x) if x else None for x in node.input]
        if any(x and (t is None or t.shape is None) for x, t in zip(list(node.input) * 2, old + new)):
            return
        changed = any(o is not None and not o.const and o.shape != n.shape for o, n in zip(old, new))
        if op == "Reshape" and len(node.input) > 1 and new[1].const and old_outs and old_outs[0] is not None:
            self._reshape(node, old, new, old_outs[0].shape, new_env)
        elif not changed:
            return
        elif op == "Expand" and new[1].const and old_outs and old_outs[0] is not None:
            self._expand(node, old, new, old_outs[0].shape, new_env)
        elif op in _BROADCAST_OPS and old_outs and old_outs[0] is not None:
            self._elementwise(node, old, new, old_outs[0].shape, new_env)
        elif op == "Concat":
            self._concat(node, old, new, new_env)
        elif op in ("Gather", "GatherND") and new[1].const and not new[0].const:
            self._gather(node, old, new, new_env)
        elif op == "GatherElements" and new[0].const and not new[1].const:
            self._gather_elements_data(node, old, new, new_env)
        elif op == "Slice" and len(node.input) > 2 and not new[0].const:
            self._slice(node, old, new, new_env)

    def _reshape(self, node, old, new, out0, env):
        in0, in1 = old[0].shape, new[0].shape
        want = out0 if in0 == in1 else _realign(in0, out0, in1, self.B0, self.B)
        if want is None:
            return
        cur = new[1].value()
        allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
        if cur is not None and _resolve_reshape(in1, [int(v) for v in np.asarray(cur).reshape(-1)], allowzero) == want:
            return
        env[node.input[1]] = self._const_input(node, 1, np.array(want, np.int64), "shape")

    def _expand(self, node, old, new, out0, env):
        in0, in1 = old[0].shape, new[0].shape
        off = len(out0) - len(in0)
        if off < 0:
            return
        want = list(out0)
        for d in range(len(in0)):
            if in0[d] != in1[d]:
                want[off + d] = in1[d]
        cur = new[1].value()
        if cur is not None and _broadcast(in1, [int(v) for v in np.asarray(cur).reshape(-1)]) == want:
            return
        env[node.input[1]] = self._const_input(node, 1, np.array(want, np.int64), "shape")

    def _elementwise(self, node, old, new, out0, env):
        live = [k for k, n in enumerate(new) if n is not None and not n.const]
        if not live:
            return
        # the batch-carrying dims: those of the non-constant operands' broadcast that changed
        out0, out1 = _broadcast(*[old[k].shape for k in live]), _broadcast(*[new[k].shape for k in live])
        if out0 is None or out1 is None or len(out0) != len(out1):
            return
        for i, (o, n) in enumerate(zip(old, new)):
            if n is None or not n.const:
                continue
            shape = list(n.shape)
            changes = []
            for j in range(1, len(shape) + 1):
                if j > len(out0) or j > len(out1):
                    break
                if shape[-j] == 1 or out1[-j] == out0[-j] or shape[-j] != out0[-j]:
                    continue
                changes.append((len(shape) - j, out0[-j], out1[-j]))
            if not self._resize_operand(node, i, n, changes, env):
                return

    def _concat(self, node, old, new, env):
        live = [k for k, n in enumerate(new) if n is not None and not n.const]
        rank = len(new[live[0]].shape)
        axis = _attr(node, "axis", 0) % rank
        for i, (o, n) in enumerate(zip(old, new)):
            if n is None or not n.const or len(n.shape) != rank:
                continue
            changes = []
            for j in range(rank):
                want = {new[k].shape[j] for k in live}
                had = {old[k].shape[j] for k in live}
                if j == axis or len(want) != 1 or want == had or n.shape[j] not in had:
                    continue
                changes.append((j, n.shape[j], want.pop()))
            if not self._resize_operand(node, i, n, changes, env):
                return

    def _resize_operand(self, node, i, n, changes, env) -> bool:
        """Give constant input ``i`` (``n``) the new batch along each ``(dim, old size, new
        size)`` of ``changes``; False (a per-sample error recorded) if it cannot."""
        if not changes:
            return True
        val = n.value(RESIZE_LIMIT)
        if val is None:
            self._per_sample(node, node.input[i], "it is too large to resize")
            return False
        for dim, size0, size1 in changes:
            val = _resize(val, dim, size0, size1, self.B0, None)
            if val is None:
                self._per_sample(node, node.input[i])
                return False
        env[node.input[i]] = self._const_input(node, i, val, "operand")
        return True

    def _gather(self, node, old, new, env):
        in0, in1 = old[0].shape, new[0].shape
        idx = new[1].value(RESIZE_LIMIT)
        if idx is None:
            return
        if node.op_type == "Gather":
            axis = _attr(node, "axis", 0) % len(in0)
            if in0[axis] == in1[axis] or in0[axis] % self.B0:
                return
            q = in0[axis] // self.B0
            m = _batch_axis(idx.shape, self.B0)
            if m is None:
                return
            step = np.full(idx.shape[:m] + (1,) + idx.shape[m + 1:], q, idx.dtype)
        else:
            if _attr(node, "batch_dims", 0) != 0 or idx.ndim < 2:
                return
            k = idx.shape[-1]
            dims = [d for d in range(min(k, len(in0))) if in0[d] != in1[d]]
            if len(dims) != 1 or in0[dims[0]] % self.B0:
                return
            d = dims[0]
            m = _batch_axis(idx.shape[:-1], self.B0)
            if m is None:
                return
            step = np.zeros(idx.shape[:m] + (1,) + idx.shape[m + 1:], idx.dtype)
            step[..., d] = in0[d] // self.B0
        new_idx = _continue(idx, m, self.B0, self.B, step)
        if new_idx is None:
            self._per_sample(node, node.input[1])
            return
        env[node.input[1]] = self._const_input(node, 1, new_idx, "indices")

    def _gather_elements_data(self, node, old, new, env):
        i0, i1, data = old[1].shape, new[1].shape, new[0]
        if len(i0) != len(data.shape):
            return
        axis = _attr(node, "axis", 0) % len(i0)
        val = None
        for j in range(len(i0)):
            if j == axis or i0[j] == i1[j] or data.shape[j] != i0[j]:
                continue
            if val is None:
                val = data.value(RESIZE_LIMIT)
                if val is None:
                    self._per_sample(node, node.input[0], "it is too large to resize")
                    return
            val = _resize(val, j, i0[j], i1[j], self.B0, None)
            if val is None:
                self._per_sample(node, node.input[0])
                return
        if val is not None:
            env[node.input[0]] = self._const_input(node, 0, val, "data")

    def _slice(self, node, old, new, env):
        in0, in1 = old[0].shape, new[0].shape
        vals = [t.value() if t is not None else None for t in new[1:5]] + [None] * 4
        starts, ends, axes = vals[0], vals[1], vals[2]
        if ends is None or starts is None or (len(node.input) > 3 and node.input[3] and axes is None):
            return
        axes = list(range(len(ends))) if axes is None else [int(a) % len(in0) for a in np.asarray(axes).reshape(-1)]
        ends = np.asarray(ends).copy()
        hit = False
        for k, a in enumerate(axes):
            if in0[a] != in1[a] and ends.reshape(-1)[k] == in0[a]:
                ends.reshape(-1)[k] = in1[a]
                hit = True
        if hit:
            env[node.input[2]] = self._const_input(node, 2, ends, "ends")

    def _per_sample(self, node, name, why="it holds different values for the samples of the exported batch"):
        self.errors.append(f"node '{node.name or node.op_type}' ({node.op_type}) combines the batch with constant "
                           f"'{name}', sized for the batch of {self.B0} the model was exported with, and {why}")

    # -- the walk -----------------------------------------------------------------------------
    def run(self, new_model: onnx.ModelProto) -> None:
        g, g_new = self.m.graph, new_model.graph
        old_env: dict[str, _T] = {}
        new_env: dict[str, _T] = {}
        for t in g.initializer:
            old_env[t.name] = new_env[t.name] = _T(t.data_type, list(t.dims), True, proto=t)
        inits = set(old_env)
        for vi_old, vi_new in zip(g.input, g_new.input):
            if vi_old.name in inits:
                continue
            old_env[vi_old.name] = _T(vi_old.type.tensor_type.elem_type, _static(vi_old))
            new_env[vi_new.name] = _T(vi_new.type.tensor_type.elem_type, _static(vi_new))
        for n_old, n_new in zip(g.node, g_new.node):
            try:
                old_outs = self.eval(n_old, old_env)
            except Exception:  # noqa: BLE001 - the walk only follows what it can evaluate
                old_outs = None
            try:
                self.follow(n_new, old_env, new_env, old_outs)
            except Exception:  # noqa: BLE001
                pass
            new_outs = None
            try:
                new_outs = self.eval(n_new, new_env)
            except Exception as e:  # noqa: BLE001
                if old_outs is not None:
                    self.errors.append(f"node '{n_new.name or n_new.op_type}' ({n_new.op_type}) fails with the new "
                                       f"shapes: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            for o, t in zip(n_old.output, old_outs or [None] * len(n_old.output)):
                if o and t is not None:
                    old_env[o] = t
            for o, t in zip(n_new.output, new_outs or [None] * len(n_new.output)):
                if o and t is not None:
                    new_env[o] = t


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _realign(in0, out0, in1, b0, b):
    """Target shape of a reshape of ``in1`` that does to it what ``in0`` -> ``out0`` did, with
    the batch (``b0`` -> ``b``) the outermost factor of the one input dimension that changed."""
    if len(in0) != len(in1):
        return None
    ch = [k for k in range(len(in0)) if in0[k] != in1[k]]
    if len(ch) != 1 or in1[ch[0]] * b0 != in0[ch[0]] * b:
        return None
    p = math.prod(in0[:ch[0]])
    acc = 1
    for j, d in enumerate(out0):
        if acc == p and d and d % b0 == 0:
            return list(out0[:j]) + [d // b0 * b] + list(out0[j + 1:])
        acc *= d
        if acc > p:
            break
    return None


def _resolve_reshape(shape_in, target, allowzero=False):
    out = [shape_in[i] if (t == 0 and not allowzero and i < len(shape_in)) else t for i, t in enumerate(target)]
    if out.count(-1) > 1:
        return None
    n = math.prod(shape_in)
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or n % rest:
            return None
        out[out.index(-1)] = n // rest
    return out if math.prod(out) == n else None


def _batch_axis(shape, b0):
    """The axis of an index tensor that runs over the batch: the first of size ``b0``."""
    for m, d in enumerate(shape):
        if d == b0:
            return m
    return None


def _continue(a: np.ndarray, axis: int, b0: int, b: int, step: np.ndarray | None):
    """``a`` (``b0`` slices along ``axis``) continued to ``b`` slices: equal slices repeat,
    integer slices in arithmetic progression (indices built from an ``arange`` over the batch)
    go on; ``step`` is the stride per sample when ``b0`` is 1. ``None`` if the slices are
    neither."""
    a = np.asarray(a)
    first = np.take(a, [0], axis=axis)
    if b0 > 1:
        d = np.take(a, [1], axis=axis) - first
        if a.dtype.kind not in "iu" and np.any(d):
            return None                  # float slices that differ: per-sample data
        i = np.arange(b0).reshape([-1 if k == axis else 1 for k in range(a.ndim)])
        if not np.array_equal(first + i * d, a):
            return None
    else:
        d = np.zeros_like(first) if step is None else np.broadcast_to(step, first.shape).astype(a.dtype)
    i = np.arange(b).reshape([-1 if k == axis else 1 for k in range(a.ndim)])
    return (first + i * d).astype(a.dtype)


def _resize(a: np.ndarray, axis: int, n0: int, n1: int, b0: int, step):
    """Constant ``a`` whose ``axis`` (size ``n0``, the batch ``b0`` times ``n0 // b0``, batch
    outermost) is resized to ``n1``; ``None`` if its values cannot be continued."""
    if n0 % b0 or n1 % (n0 // b0):
        return None
    q = n0 // b0
    b = n1 // q
    sh = a.shape
    split = a.reshape(sh[:axis] + (b0, q) + sh[axis + 1:])
    out = _continue(split, axis, b0, b, step)
    if out is None:
        return None
    return out.reshape(sh[:axis] + (n1,) + sh[axis + 1:])


def old_batch_of(model: onnx.ModelProto) -> int | None:
    """The static first dimension of the model's run-time inputs (``None`` if symbolic)."""
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value"):
            return int(dims[0].dim_value)
    return None


def set_batch_size(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of ``model`` whose run-time inputs have ``batch`` as their first dimension, with the
    constants that hard-code the exported batch rewritten (module docstring).

    Raises ``ValueError`` naming the node when the model cannot follow the new batch.
    """
    if batch < 1:
        raise ValueError(f"the batch size must be at least 1, not {batch}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name for t in out.graph.initializer}
    old = old_batch_of(model)
    for vi in out.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_value = int(batch)
    for vi in out.graph.output:
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = "batch"
    del out.graph.value_info[:]
    if old is None or old == batch:
        return out
    w = _Walker(model, old, batch)
    w.run(out)
    out.graph.initializer.extend(w.new_inits)
    if out.ir_version < 4:      # IR version 3 wants every initializer listed as a graph input too
        out.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                               for t in w.new_inits)
    if w.errors:
        raise ValueError(f"the model was exported for a batch of {old}, which it hard-codes, and openipu cannot "
                         f"change it to {batch}: {w.errors[0]}"
                         + (f" (and {len(w.errors) - 1} more)" if len(w.errors) > 1 else "")
                         + f". Run it with batch size {old}, or re-export it with a dynamic batch dimension "
                         "(torch.onnx.export(..., dynamic_axes={name: {0: 'batch'}}) or dynamic_shapes with dynamo=True)")
    return out
