"""``builder.aiOnnx`` / ``builder.aiOnnxOpsetN``: PopART's ai.onnx opset classes, generated from
the installed onnx's ``onnx.defs`` schemas.

Each op method is ``op(args, [num_outputs,] <attributes with ONNX defaults>, debugContext="")``:
lower-case names, ``And/Or/Xor/Not/If`` as ``logical_and`` ... ``logical_if`` (:func:`method_name`).
A method adds one node through the owning :class:`openipu.popart.builder.Builder` and returns its
output id (a list for ops with several outputs); wrong input counts raise PopART's
``popart_exception``.
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from openipu.popart.debug_prefix import rename_debug_prefix
from openipu.popart.tensorinfo import ONNX_OF, dtype_name

DEFAULT_AI_ONNX_OPSET = 10

_RENAMED = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor", "Not": "logical_not", "If": "logical_if"}


def method_name(op_type: str) -> str:
    """The ``aiOnnx`` method that adds ONNX op ``op_type``: ``"Add"`` -> ``add``, ``"And"`` ->
    ``logical_and`` (PopART's spelling)."""
    return _RENAMED.get(op_type, op_type.lower())


def _to_attr_value(name, value, attr_type=None):
    """A Python / numpy value as something ``helper.make_attribute`` takes; ``None`` = omit."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 0:
        return None
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(np.ascontiguousarray(value).reshape(value.shape), name)
    if isinstance(value, (np.integer, bool)):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    from openipu.popart.builder import Builder

    if isinstance(value, Builder):
        return value._model.graph
    if attr_type == onnx.AttributeProto.FLOAT and isinstance(value, int):
        return float(value)
    if attr_type == onnx.AttributeProto.FLOATS and isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    if attr_type == onnx.AttributeProto.TENSOR and not isinstance(value, onnx.TensorProto):
        return numpy_helper.from_array(np.asarray(value), name)
    return value


# ----------------------------------------------------------------------------------------------
# opset classes generated from onnx.defs
# ----------------------------------------------------------------------------------------------
def _schemas_for(version: int) -> dict[str, defs.OpSchema]:
    """Latest ai.onnx schema of each op with since_version <= version (deprecated ones left out)."""
    best: dict[str, defs.OpSchema] = {}
    for s in defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx") or s.since_version > version:
            continue
        cur = best.get(s.name)
        if cur is None or s.since_version > cur.since_version:
            best[s.name] = s
    return {k: s for k, s in best.items() if not s.deprecated}


def _output_arity(schema) -> tuple[bool, int]:
    """``(takes_num_outputs, fixed_count)``."""
    outs = schema.outputs
    if schema.max_output == 1:
        return False, 1
    fixed = all(o.option == defs.OpSchema.FormalParameterOption.Single for o in outs)
    return (not fixed), len(outs)


def _make_onnx_method(schema):
    op = schema.name
    takes_args = schema.max_input > 0
    takes_n, n_fixed = _output_arity(schema)
    attrs = schema.attributes
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD)]
    if op == "Constant":
        params += [P("value", P.POSITIONAL_OR_KEYWORD), P("is_value_sparse", P.POSITIONAL_OR_KEYWORD, default=False)]
        attr_names = []
    else:
        if takes_args:
            params.append(P("args", P.POSITIONAL_OR_KEYWORD))
        if takes_n:
            params.append(P("num_outputs", P.POSITIONAL_OR_KEYWORD))
        # Split-18's ``num_outputs`` attribute is the ``num_outputs`` argument
        own = {n: a for n, a in attrs.items() if not (takes_n and n == "num_outputs")}
        required = sorted(n for n, a in own.items() if a.required and a.type != onnx.AttributeProto.GRAPH)
        optional = sorted(n for n, a in own.items() if not a.required)
        graphs = sorted(n for n, a in attrs.items() if a.required and a.type == onnx.AttributeProto.GRAPH)
        # PopART's order: the subgraphs first (``scan(args, num_outputs, body, num_scan_inputs, ...)``)
        attr_names = graphs + required + optional
        for n in graphs + required:
            params.append(P(n, P.POSITIONAL_OR_KEYWORD))
        for n in optional:
            a = attrs[n]
            dv = helper.get_attribute_value(a.default_value) if a.default_value.name else None
            if isinstance(dv, bytes):
                dv = dv.decode()
            if isinstance(dv, onnx.TensorProto):
                dv = None
            params.append(P(n, P.POSITIONAL_OR_KEYWORD, default=dv))
    params.append(P("debugContext", P.POSITIONAL_OR_KEYWORD, default=""))
    sig = inspect.Signature(params)

    def method(self, *a, **kw):
        b = sig.bind(self, *a, **rename_debug_prefix(kw, method_name(op)))
        b.apply_defaults()
        v = b.arguments
        if op == "Constant":
            value = v["value"]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            at = {"value": numpy_helper.from_array(np.ascontiguousarray(value).reshape(value.shape), "value")}
            return self._builder._op(op, "", self._version, [], 1, at, v["debugContext"])[0]
        at = {}
        for n in attr_names:
            val = v[n]
            if op == "Cast" and n == "to" and not isinstance(val, (int, np.integer)):
                val = ONNX_OF[dtype_name(val)]
            at[n] = _to_attr_value(n, val, attrs[n].type)
            if n == "axes" and op.startswith("Reduce") and isinstance(val, (list, tuple)) and not val:
                # PopART keeps an empty ``axes`` list (its ReduceOp then reduces over no axis)
                at[n] = helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS)
        inputs = list(v["args"]) if takes_args else []
        n_out = int(v["num_outputs"]) if takes_n else n_fixed
        if takes_n and "num_outputs" in attrs and len(inputs) < 2:      # Split-18 without a split input
            at["num_outputs"] = _to_attr_value("num_outputs", n_out, attrs["num_outputs"].type)
        outs = self._builder._op(op, "", self._version, inputs, n_out, at, v["debugContext"], schema=schema)
        return outs if (takes_n or n_fixed > 1) else outs[0]

    name = method_name(op)
    method.__name__ = name
    method.__qualname__ = name
    method.__signature__ = sig
    method.__doc__ = f"ONNX ``{op}`` (opset {schema.since_version} definition) added to the graph."
    return name, method


class _Opset:
    """Base of the ``aiOnnxOpsetN`` op tables."""

    domain = ""
    _version = DEFAULT_AI_ONNX_OPSET

    def __init__(self, builder: "Builder"):
        self._builder = builder

    def getOpsetVersion(self) -> int:  # noqa: N802
        return self._version


_OPSET_CLASSES: dict[int, type] = {}


def opset_class(version: int) -> type:
    """The generated op-table class for ai.onnx opset ``version`` (cached)."""
    cls = _OPSET_CLASSES.get(version)
    if cls is None:
        methods = {"_version": version}
        for schema in _schemas_for(version).values():
            name, fn = _make_onnx_method(schema)
            methods[name] = fn
        cls = type(f"AiOnnxOpset{version}", (_Opset,), methods)
        _OPSET_CLASSES[version] = cls
    return cls


