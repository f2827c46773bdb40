"""Capture a Keras model's forward pass as ONNX (tf2onnx ``from_function``) with its variables
identified, so PopART can train them and the trained values can flow back into Keras.

tf2onnx freezes variables into initializers and may transpose them (NHWC convolution kernels
become OIHW). To find which initializer is which variable, and in which layout, every variable
is temporarily set to distinct integer "sentinel" values before the conversion; an initializer
holding exactly one variable's sentinels (in some axis order) is that variable. Keras
``Dropout`` layers are captured as a marker multiply and become ONNX ``Dropout`` nodes (applied
in training, PopART's random masks; identity in inference).
"""

import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

_MAX_SENTINEL = 2 ** 24          # float32 holds every integer up to here exactly
_MARK0 = -7919.25                # dropout marker factors: _MARK0 - i (negative, non-integer)


_CAPTURING = [0]


def capturing() -> bool:
    """True while a function is being converted to ONNX (ops that only change the IPU's memory
    plan, not the values, e.g. serialised matmuls and lookups, then emit their plain form: slices of
    a variable would be folded into constants and lose the variable)."""
    return _CAPTURING[0] > 0


class VariableMap:
    """How one Keras variable appears in the ONNX model: ``name`` (the initializer id, the
    variable's path), ``perm`` (ONNX value = Keras value transposed by ``perm``, then reshaped
    to ``shape``)."""

    def __init__(self, variable, name, perm, shape):
        self.variable, self.name, self.perm, self.shape = variable, name, tuple(perm), tuple(shape)

    def to_onnx(self, value: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(value, self.perm)).reshape(self.shape)

    def to_keras(self, value: np.ndarray) -> np.ndarray:
        inv = np.argsort(self.perm)
        kshape = tuple(self.variable.shape[i] for i in self.perm)
        return np.transpose(np.asarray(value).reshape(kshape), inv)


class Captured:
    """The captured forward: ``model`` (ONNX, weights as float initializers named after the
    Keras variables, other constants as Constant nodes), ``inputs`` / ``outputs`` ids
    (``input`` / ``output``: the first), the ``variables`` (:class:`VariableMap` list) and
    ``dropouts`` (count)."""

    def __init__(self, model, inputs, outputs, variables, dropouts):
        self.model, self.inputs, self.outputs, self.variables, self.dropouts = \
            model, list(inputs), list(outputs), variables, dropouts
        self.input, self.output = self.inputs[0] if self.inputs else None, self.outputs[0]


def _find_perm(sentinel: np.ndarray, arr: np.ndarray):
    for perm in itertools.permutations(range(sentinel.ndim)):
        t = np.transpose(sentinel, perm)
        if t.size == arr.size and np.array_equal(t.reshape(-1), arr.reshape(-1)):
            return perm
    return None


def capture(model, input_shape, input_dtype="float32", opset: int = 17, x_structure=None) -> Captured:
    """Convert ``model`` (a built Keras 3 model) called with ``training=False`` on a batch.

    One input: ``input_shape`` is the batch shape (``[batch, ...]``), ``input_dtype`` its dtype.
    Several inputs (a list, tuple or dict of inputs, as Keras takes them): ``input_shape`` and
    ``input_dtype`` are lists in ``tf.nest.flatten`` order of ``x_structure`` (a sample of that
    structure; dict keys sorted). The :class:`Captured` has one ONNX input per flat input and one
    output per flat model output (``tf.nest.flatten`` order); ``out_structure`` is the model's
    output structure (with ``None`` leaves). Raises ``NotImplementedError`` when a variable cannot
    be found in the converted graph (tf2onnx folded it into arithmetic, e.g. a fused batch norm),
    or the model has more than 16.7 million weights."""
    import tensorflow as tf

    if x_structure is None:
        shapes, dtypes = [input_shape], [input_dtype]
    else:
        shapes, dtypes = list(input_shape), list(input_dtype)
    spec = [tf.TensorSpec(tuple(sh), tf.as_dtype(dt), name=f"x{i}" if i else "x")
            for i, (sh, dt) in enumerate(zip(shapes, dtypes))]
    structure = {}

    def forward(*xs):
        x = xs[0] if x_structure is None else tf.nest.pack_sequence_as(x_structure, list(xs))
        y = model(x, training=False)
        structure["out"] = tf.nest.map_structure(lambda _: None, y)
        flat = tf.nest.flatten(y)
        return flat[0] if len(flat) == 1 and not tf.nest.is_nested(y) else flat
    cap = capture_function(forward, spec, list(model.variables), opset)
    cap.out_structure = structure.get("out")
    return cap


def capture_function(fn, input_signature, variables, opset: int = 17) -> Captured:
    """Convert the TensorFlow function ``fn(*inputs)`` (traced with ``input_signature``, a list
    of ``tf.TensorSpec``) to ONNX with the ``variables`` it reads identified (sentinel values,
    see the module docstring). ``fn`` may return one tensor or a flat list of tensors; the
    :class:`Captured` lists every graph input / output in ``inputs`` / ``outputs`` (``input`` /
    ``output``: the first). Keras ``Dropout`` layers become ONNX ``Dropout`` nodes, layers in a
    pipeline stage get the stage's name scope. Raises ``NotImplementedError`` as :func:`capture`."""
    import keras
    import tensorflow as tf
    import tf2onnx

    saved = [v.numpy() for v in variables]
    total = sum(int(np.prod(v.shape)) for v in variables)
    if total + 1 >= _MAX_SENTINEL:
        raise NotImplementedError(f"capturing models of more than {_MAX_SENTINEL - 2} weights ({total})")
    sentinels, off = [], 1
    for v in variables:
        n = int(np.prod(v.shape))
        s = np.arange(off, off + n, dtype=np.float64).reshape(tuple(v.shape))
        sentinels.append((off, off + n, s))
        off += n

    drop_rates = []
    orig_call = keras.layers.Dropout.call

    def marked_call(layer, inputs, training=None):
        if not layer.rate:
            return inputs
        drop_rates.append(float(layer.rate))
        return tf.multiply(inputs, tf.constant(_MARK0 - (len(drop_rates) - 1), dtype=inputs.dtype))

    orig_layer_call = keras.layers.Layer.__call__

    def staged_call(layer, *args, **kwargs):
        stage = getattr(layer, "_openipu_stage", None)
        if stage is None:
            return orig_layer_call(layer, *args, **kwargs)
        with tf.name_scope(f"{STAGE_SCOPE}{stage}"):
            return orig_layer_call(layer, *args, **kwargs)

    def traced(*args):
        drop_rates.clear()          # tf2onnx may trace more than once
        return fn(*args)

    try:
        keras.layers.Layer.__call__ = staged_call
        for v, (_, _, s) in zip(variables, sentinels):
            if v.dtype in ("float32", "float16", "bfloat16", "float64"):
                v.assign(s.astype(v.dtype))
        keras.layers.Dropout.call = marked_call
        _CAPTURING[0] += 1
        try:
            proto, _ = tf2onnx.convert.from_function(tf.function(traced, autograph=False),
                                                     input_signature=list(input_signature), opset=opset)
        finally:
            _CAPTURING[0] -= 1
    finally:
        keras.layers.Layer.__call__ = orig_layer_call
        keras.layers.Dropout.call = orig_call
        for v, val in zip(variables, saved):
            v.assign(val)
    return _rewrite(proto, variables, saved, sentinels, drop_rates)


def _find_gather(sentinels, arr, used):
    """``(variable index, positions)`` when the non-zero values of ``arr`` are every sentinel of
    one unused variable exactly once (tf2onnx re-packed it: an LSTM's gates reordered and its
    bias padded with the recurrence bias's zeros); ``positions`` (``arr``'s shape, int64) holds
    each element's flat index in the Keras variable, ``-1`` for the zeros."""
    vals = arr.reshape(-1).astype(np.float64)
    nz = vals != 0
    if not nz.any() or not np.all(vals[nz] == np.round(vals[nz])):
        return None
    lo = float(vals[nz].min())
    for idx, (start, stop, _) in enumerate(sentinels):
        if start <= lo < stop:
            if idx in used or int(nz.sum()) != stop - start:
                return None
            flat = vals[nz].astype(np.int64) - start
            if flat.max() >= stop - start or np.unique(flat).size != flat.size:
                return None
            pos = np.full(vals.shape, -1, np.int64)
            pos[nz] = flat
            return idx, pos.reshape(arr.shape)
    return None


def _gather_nodes(init_name, weight_name, pos, size):
    """ONNX nodes computing ``init_name`` (the re-packed tensor) from the weight ``weight_name``
    (Keras layout): ``Gather(Concat(Reshape(w, [-1]), [0]), positions)`` with the zeros taken
    from the appended 0 (a constant: they stay zero, as tf2onnx's padding)."""
    p = f"{init_name}__openipu"
    idx = np.where(pos < 0, size, pos).astype(np.int64)
    return [helper.make_node("Constant", [], [f"{p}_shape"], value=numpy_helper.from_array(np.array([-1], np.int64))),
            helper.make_node("Constant", [], [f"{p}_zero"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
            helper.make_node("Constant", [], [f"{p}_idx"], value=numpy_helper.from_array(idx)),
            helper.make_node("Reshape", [weight_name, f"{p}_shape"], [f"{p}_flat"]),
            helper.make_node("Concat", [f"{p}_flat", f"{p}_zero"], [f"{p}_padded"], axis=0),
            helper.make_node("Gather", [f"{p}_padded", f"{p}_idx"], [init_name], axis=0)]


def _rewrite(proto, variables, saved, sentinels, drop_rates) -> Captured:
    g = proto.graph
    maps, rename, consts, used = [], {}, [], set()
    gathers = []                    # nodes re-packing weights in tf2onnx's layout (LSTM / GRU)
    for init in list(g.initializer):
        arr = numpy_helper.to_array(init)
        hit = None
        if arr.dtype.kind == "f" and arr.size:
            lo = float(arr.min())
            for idx, (start, stop, s) in enumerate(sentinels):
                if lo == start and arr.size == stop - start and idx not in used:
                    perm = _find_perm(s, arr)
                    if perm is not None:
                        hit = (idx, perm)
                    break
        if hit is None:
            found = _find_gather(sentinels, arr, used) if arr.dtype.kind == "f" and arr.size else None
            if found is None:
                consts.append(init)
                continue
            idx, pos = found
            used.add(idx)
            v = variables[idx]
            vm = VariableMap(v, v.path, tuple(range(len(v.shape))), tuple(v.shape))
            gathers += _gather_nodes(init.name, vm.name, pos, int(np.prod(v.shape)))
            g.initializer.remove(init)
            g.initializer.append(numpy_helper.from_array(np.asarray(saved[idx]).astype(arr.dtype), vm.name))
            keep = [i for i in g.input if i.name != init.name]
            del g.input[:]
            g.input.extend(keep)
            maps.append(vm)
            continue
        idx, perm = hit
        used.add(idx)
        v = variables[idx]
        vm = VariableMap(v, v.path, perm, arr.shape)
        rename[init.name] = vm.name
        init.CopyFrom(numpy_helper.from_array(vm.to_onnx(saved[idx]).astype(arr.dtype), vm.name))
        maps.append(vm)
    missing = [v.path for i, v in enumerate(variables) if i not in used and v.trainable]
    if missing:
        raise NotImplementedError(f"the ONNX conversion folded the variables {missing} into other constants (or "
                                  "dropped them): this model cannot be trained on the IPU yet")
    for node in g.node:
        for i, x in enumerate(node.input):
            if x in rename:
                node.input[i] = rename[x]
    # non-weight constants become Constant nodes (PopART trains every float initializer)
    const_nodes = []
    for init in consts:
        g.initializer.remove(init)
        const_nodes.append(helper.make_node("Constant", [], [init.name], value=init))
    const_names = {c.name for c in consts}
    keep = [i for i in g.input if i.name not in const_names]
    del g.input[:]
    g.input.extend(keep)
    values = {c.name: numpy_helper.to_array(c) for c in consts}
    nodes = _replace_dropout_markers(const_nodes + gathers + list(g.node), values, drop_rates)
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(proto)
    return Captured(proto, [i.name for i in g.input], [o.name for o in g.output], maps, len(drop_rates))


DROPOUT_TRAINING = "openipu_dropout_training_mode"
STAGE_SCOPE = "openipu_pipeline_stage_"


def node_stages(model: onnx.ModelProto) -> list:
    """The pipeline stage of every node of a captured model (``None`` when the model has no
    stages): a layer's stage is in its ops' name scope (``openipu_pipeline_stage_<n>/``); other
    nodes (layout transposes, reshapes tf2onnx added) take the latest stage of their inputs, and
    nodes with no staged input (constants, the input's reshape) the earliest stage of their
    consumers."""
    import re
    nodes = list(model.graph.node)
    tagged = [re.search(STAGE_SCOPE + r"(\d+)/", n.name) for n in nodes]
    if not any(tagged):
        return [None] * len(nodes)
    stage = [int(t.group(1)) if t else None for t in tagged]
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    for i, n in enumerate(nodes):
        if stage[i] is None:
            ins = [stage[producer[x]] for x in n.input if x in producer and stage[producer[x]] is not None]
            stage[i] = max(ins) if ins else None
    for i in reversed(range(len(nodes))):
        if stage[i] is None:
            outs = {o for o in nodes[i].output}
            cons = [stage[j] for j, m in enumerate(nodes) if outs & set(m.input) and stage[j] is not None]
            stage[i] = min(cons) if cons else 0
    return stage


def _replace_dropout_markers(nodes, values, drop_rates):
    """Marker multiplies ``x * (_MARK0 - i)`` become ONNX ``Dropout(x, ratio_i, training_mode)``
    (``training_mode`` one shared bool Constant, true; :func:`set_training` flips it)."""
    if not drop_rates:
        return nodes
    out = [helper.make_node("Constant", [], [DROPOUT_TRAINING],
                            value=numpy_helper.from_array(np.array(True), DROPOUT_TRAINING))]
    found = 0
    for n in nodes:
        if n.op_type == "Mul" and len(n.input) == 2:
            for k in (0, 1):
                c = values.get(n.input[k])
                if c is not None and c.size == 1 and float(c.reshape(-1)[0]) < _MARK0 + 0.5 and \
                        float(c.reshape(-1)[0]) % 1 == 0.75:
                    i = int(round(_MARK0 - float(c.reshape(-1)[0])))
                    rid = f"openipu_dropout_ratio_{i}"
                    out.append(helper.make_node("Constant", [], [rid], value=numpy_helper.from_array(
                        np.array(drop_rates[i], np.float32), rid)))
                    out.append(helper.make_node("Dropout", [n.input[1 - k], rid, DROPOUT_TRAINING], [n.output[0]],
                                                name=n.name or f"dropout_{i}"))
                    found += 1
                    break
            else:
                out.append(n)
            continue
        out.append(n)
    if found != len(drop_rates):
        raise NotImplementedError(f"found {found} of the model's {len(drop_rates)} Dropout layers in the ONNX graph")
    return out


def set_training(model: onnx.ModelProto, training: bool) -> onnx.ModelProto:
    """A copy of a captured model whose Dropout nodes are on (training) or off (inference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        if n.op_type == "Constant" and n.output[0] == DROPOUT_TRAINING:
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(bool(training)), DROPOUT_TRAINING))
    return m
