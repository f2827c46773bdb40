"""ONNX model conversions applied before compiling, as PopRT's converter does.

``convert_float_to_half`` is PopRT's ``--precision fp16`` pass: every float32 tensor of the
model becomes float16 (initializers, Constant / ConstantOfShape values, graph inputs and outputs,
``Cast`` targets and ops' ``dtype`` attributes); finite constants beyond float16's range are
clipped to +-65504 (a float32 ``-3.4e38`` mask value stays finite). Intermediate shapes are re-inferred by the
importer. Integer and boolean tensors are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

_F32, _F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _half_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type != _F32:
        return t
    arr = numpy_helper.to_array(t)
    fin = np.isfinite(arr)
    arr = np.where(fin, np.clip(arr, -65504.0, 65504.0), arr).astype(np.float16)  # finite values stay finite
    out = numpy_helper.from_array(arr, t.name)
    return out


def _convert_graph(g: onnx.GraphProto) -> None:
    for i, t in enumerate(g.initializer):
        if t.data_type == _F32:
            g.initializer[i].CopyFrom(_half_tensor(t))
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == _F32:
            vi.type.tensor_type.elem_type = _F16
    del g.value_info[:]
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _F32:
                a.t.CopyFrom(_half_tensor(a.t))
            elif a.type == onnx.AttributeProto.GRAPH:
                _convert_graph(a.g)
            elif a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == _F32:
                a.i = _F16


def convert_float_to_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with float32 replaced by float16 throughout (PopRT's fp16 pass).

    Args:
        model: an ONNX ``ModelProto`` (any opset).
    Returns:
        A new ``ModelProto``; ``model`` is not modified. Graph inputs that were float32 become
        float16, so callers must feed float16 arrays.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _convert_graph(out.graph)
    return out


# ==========================================================================================
# PopRT's Converter
# ==========================================================================================
import math  # noqa: E402

from openipu.poprt.passes.base import GraphView, Pass, replace_repeated  # noqa: E402

PRECISIONS = ("fp32", "fp16", "fp8", "fp8_weight")
FP8_TARGETS = ("ipu21",)
IPU_VERSIONS = ("ipu2", "ipu21")
_FP8_OPS = ("MatMul", "Gemm", "Conv")
_FP8_MAX = {"F143": 448.0, "F152": 57344.0}


class ConverterError(ValueError):
    """A converter option or a model the converter cannot handle (PopRT reports these as errors
    of the conversion and exits non-zero)."""


def parse_fp8_params(text) -> tuple:
    """PopRT's ``fp8_params`` ``'F143,F143,-3,-3'``: (input format, weight format, input scale,
    weight scale). Formats ``F143`` (E4M3) or ``F152`` (E5M2); scales are powers of two (ints):
    a tensor ``t`` is stored as ``fp8(t * 2**scale)``. A scale may be left empty (``'F143,F143,,'``)
    to have it calibrated.

    Raises:
        ConverterError: not four fields, an unknown format, or a scale that is not an integer.
    """
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    else:
        parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 4:
        raise ConverterError(f"fp8_params must be 'INPUT_FORMAT,WEIGHT_FORMAT,INPUT_SCALE,WEIGHT_SCALE' "
                             f"(e.g. 'F143,F143,-3,-3'), got {text!r}")
    fin, fw = parts[0].upper(), parts[1].upper()
    for f in (fin, fw):
        if f not in _FP8_MAX:
            raise ConverterError(f"fp8_params: unknown fp8 format {f!r} (use F143 or F152)")
    scales = []
    for s in parts[2:]:
        if s in ("", "None", "none"):
            scales.append(None)
            continue
        try:
            scales.append(int(s))
        except ValueError:
            raise ConverterError(f"fp8_params: scale {s!r} is not an integer") from None
    return fin, fw, scales[0], scales[1]


def _names(v) -> set:
    if not v:
        return set()
    if isinstance(v, str):
        return {s.strip() for s in v.split(",") if s.strip()}
    return {str(s) for s in v}


class Converter:
    """PopRT's converter (``poprt.converter.Converter``, also ``poprt.Converter``).

    ``Converter(**options).convert(model) -> onnx.ModelProto`` (a new model; ``model`` unchanged).
    Steps, in PopRT's order: check the model (``onnx.checker``), convert the opset
    (``convert_version``, ``onnx.version_converter``), set input shapes (``input_shape``, or
    ``batch_size`` for the first dimension: batch constants followed by
    :func:`openipu.poprt.batch.set_batch_size`), run the passes (``used_passes``, in order, by
    name, :mod:`openipu.poprt.passes`), then change precision, then infer shapes to check the
    result.

    Options:
        input_shape: ``{input name: [dims]}``.
        batch_size: int, the first dimension of every run-time input.
        precision: ``'fp32'`` (default), ``'fp16'`` (every float32 tensor to float16, except the ops
            of ``fp16_skip_op_types``, which run in float32 between casts), ``'fp8'`` (fp16, and
            every ``MatMul`` / ``Gemm`` / ``Conv`` with constant weights, unless named in
            ``fp8_skip_op_names``, becomes ``ai.graphcore::FP8MatMul`` / ``FP8Conv`` with fp8
            inputs and weights), ``'fp8_weight'`` (fp8 weights only; activations stay fp16).
        fp16_skip_op_types: op types kept in float32 (list or comma-separated str).
        fp8_params: ``'F143,F143,-3,-3'`` (:func:`parse_fp8_params`). Scales not given are
            calibrated: the weight scale from the weights' largest magnitude, the input scale from
            the largest input magnitude seen by onnxruntime on ``calibration_inputs`` (default:
            seeded random inputs), both as ``floor(log2(fp8_max / amax))``.
        fp8_skip_op_names: node names kept in fp16 (list or comma-separated str).
        calibration_inputs: ``{input name: ndarray}`` for fp8 input-scale calibration.
        ipu_version: ``'ipu21'`` (default; C600) or ``'ipu2'``; fp8 needs ``ipu21``.
        convert_version: target ai.onnx opset (int).
        used_passes: pass names (list or comma-separated str).
        check: check the model with ``onnx.checker`` first (default True).
        skip_passes: pass names removed from ``used_passes``.
        enable_erf_gelu: adds ``erf_gelu_pattern`` to the passes.
        quantize, disable_fast_norm, remap_mode, infer_shape_ahead, enable_avoid_overflow_patterns,
            disable_progress_bar: accepted for compatibility, no effect (tensor re-mapping, norm
            kernels and the order of shape inference are the simulator's compiler's choice).
        enable_insert_remap: runs the ``auto_insert_remap`` pass (accepted, no effect here).
        pass_config: ``[(pass name, {keyword arguments}), ...]`` run after ``used_passes``
            (the CLI's ``--custom_pass_config``).
        merge_matmul, merge_matmul_add: groups of ``MatMul`` names sharing an input, ``'A,B,C;D,E'``
            or a list of lists (:mod:`openipu.poprt.passes.matmul`).
        serialize_matmul, serialize_matmul_add: ``{MatMul name: 'FACTOR[/MODE]'}`` or
            ``['NAME=FACTOR[/MODE]', ...]``; modes ``output_channels`` (default), ``input_channels``,
            ``reducing_dim``.
        max_tensor_size: run ``constant_folding``, keeping results larger than this many bytes
            as nodes (``-1``: no limit). Not given: no folding here (PopART folds at compile time).
        checkpoints: tensor names (list or comma-separated) made extra graph outputs (``add_outputs``).
        pack_args: ``{max_valid_num, segment_max_size, mask_name, dynamic_input_name}``: the model
            takes packed sequences. The ``insert_attention_mask`` pass gives its attention the
            block-diagonal mask of the ``mask_name`` input (default: the input named ``*mask*``),
            the sequence length must be ``segment_max_size``, and the settings are stored in the
            model (``metadata_props['poprt.pack_args']``, JSON), where the compiler and
            :class:`openipu.poprt.runtime.PackRunner` find them. PopRT's other pack mode (pack /
            unpack / repack ops: ``head_pattern``, ``dynamic_groups``) is not implemented.

    The last pass is ``final_check``, looked up by name when ``convert`` runs (a client may map
    the name to its own class, as Byte MLPerf's IPU backend does).

    Raises:
        ConverterError: unknown option or value, fp8 on a target without fp8, a bad
            ``fp8_params``, an unknown input name in ``input_shape``, a model the checker rejects.
        openipu.poprt.passes.PassError: an unknown pass name.
    """

    _OPTIONS = {"input_shape", "batch_size", "precision", "fp16_skip_op_types", "fp8_params", "fp8_skip_op_names",
                "calibration_inputs", "ipu_version", "convert_version", "used_passes", "check", "quantize",
                "enable_erf_gelu", "enable_insert_remap", "disable_fast_norm", "skip_passes", "pass_config",
                "merge_matmul", "merge_matmul_add", "serialize_matmul", "serialize_matmul_add", "max_tensor_size",
                "checkpoints", "pack_args", "remap_mode", "infer_shape_ahead", "enable_avoid_overflow_patterns",
                "disable_progress_bar"}
    _PACK_KEYS = {"max_valid_num", "segment_max_size", "mask_name", "dynamic_input_name"}

    def __init__(self, **options):
        unknown = set(options) - self._OPTIONS
        if unknown:
            raise ConverterError(f"Converter: unknown option(s) {', '.join(sorted(unknown))}; "
                                 f"accepted: {', '.join(sorted(self._OPTIONS))}")
        self.input_shape = {str(k): [int(d) for d in v] for k, v in (options.get("input_shape") or {}).items()}
        self.batch_size = options.get("batch_size")
        self.precision = str(options.get("precision") or "fp32").lower()
        if self.precision not in PRECISIONS:
            raise ConverterError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        self.ipu_version = str(options.get("ipu_version") or "ipu21").lower()
        if self.ipu_version not in IPU_VERSIONS:
            raise ConverterError(f"ipu_version must be one of {', '.join(IPU_VERSIONS)}, got {self.ipu_version!r}")
        if self.precision in ("fp8", "fp8_weight") and self.ipu_version not in FP8_TARGETS:
            raise ConverterError(f"precision {self.precision} needs an IPU with fp8 (ipu21, C600); "
                                 f"ipu_version is {self.ipu_version}")
        self.fp16_skip_op_types = _names(options.get("fp16_skip_op_types"))
        self.fp8_skip_op_names = _names(options.get("fp8_skip_op_names"))
        fp8 = options.get("fp8_params")
        self.fp8_params = parse_fp8_params(fp8) if fp8 else ("F143", "F143", None, None)
        self.calibration_inputs = options.get("calibration_inputs")
        self.convert_version = options.get("convert_version")
        used = options.get("used_passes") or []
        self.used_passes = [p for p in (_names(used) if isinstance(used, str) else used)]
        if isinstance(used, str):
            self.used_passes = [s.strip() for s in used.split(",") if s.strip()]
        skip = _names(options.get("skip_passes"))
        if options.get("enable_erf_gelu") and "erf_gelu_pattern" not in self.used_passes:
            self.used_passes.append("erf_gelu_pattern")
        self.used_passes = [p for p in self.used_passes if p not in skip]
        for p in self.used_passes:
            Pass.get_pass(p)                           # unknown names fail now, not mid-way
        self.check = bool(options.get("check", True))
        self.applied: dict[str, list] = {}
        # graph rewrites with arguments, in the order they run after used_passes
        self.extra_passes: list[tuple[str, dict]] = [(str(n), dict(kw or {})) for n, kw in options.get("pass_config") or []]
        for name in ("merge_matmul", "merge_matmul_add"):
            if options.get(name):
                self.extra_passes.append((name, {"groups": options[name]}))
        for name in ("serialize_matmul", "serialize_matmul_add"):
            if options.get(name):
                self.extra_passes.append((name, {"config": options[name]}))
        if options.get("max_tensor_size") is not None:
            self.extra_passes.append(("constant_folding", {"max_tensor_size": int(options["max_tensor_size"])}))
        self.pack_args = dict(options.get("pack_args") or {})
        bad = set(self.pack_args) - self._PACK_KEYS
        if bad:
            raise ConverterError(f"pack_args {', '.join(sorted(bad))}: PopRT's pack / unpack / repack op mode is not "
                                 f"implemented; packing here is the attention-mask mode (keys "
                                 f"{', '.join(sorted(self._PACK_KEYS))}) with PackRunner's single-row mask")
        if self.pack_args:
            self.extra_passes.append(("insert_attention_mask", {"mask_input": self.pack_args["mask_name"]}
                                      if self.pack_args.get("mask_name") else {}))
        if options.get("checkpoints"):
            self.extra_passes.append(("add_outputs", {"names": options["checkpoints"]}))
        if options.get("enable_insert_remap"):
            self.extra_passes.append(("auto_insert_remap", {}))
        for n, _kw in self.extra_passes:
            Pass.get_pass(n)

    # ------------------------------------------------------------------------------------
    def convert(self, model) -> onnx.ModelProto:
        """The converted copy of ``model`` (a ``ModelProto``, or a path / bytes of one)."""
        if isinstance(model, (str, bytes)) and not isinstance(model, bytes) or hasattr(model, "__fspath__"):
            model = onnx.load(str(model))
        elif isinstance(model, bytes):
            model = onnx.load_from_string(model)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        if self.check:
            try:
                onnx.checker.check_model(out)
            except onnx.checker.ValidationError as e:
                raise ConverterError(f"the input model is not valid ONNX: {str(e).splitlines()[0]}") from None
        if self.convert_version:
            from onnx import version_converter
            try:
                out = version_converter.convert_version(out, int(self.convert_version))
            except Exception as e:  # noqa: BLE001 - the converter's own errors, reported in one line
                raise ConverterError(f"convert_version {self.convert_version}: {str(e).splitlines()[0]}") from None
        out = self._shapes(out)
        # fp8 input scales are calibrated on the model before the passes (onnxruntime runs only
        # standard ops); the passes keep the names of the products' outputs
        calib = self._calibrate(out) if self.precision == "fp8" else {}
        for name in self.used_passes:
            p = Pass.get_pass(name)
            out = p(out)
            self.applied[name] = list(p.applied)
        for name, kw in self.extra_passes:
            p = Pass.get_pass(name, **kw)
            out = p(out)
            self.applied.setdefault(name, []).extend(p.applied)
        if self.pack_args:
            self._pack(out)
        if self.precision in ("fp16", "fp8", "fp8_weight"):
            out = self._to_half(out)
        if self.precision in ("fp8", "fp8_weight"):
            out = self._to_fp8(out, calib)
        _fix_inputs(out)
        out = Pass.get_pass("final_check")(out)
        try:
            onnx.shape_inference.infer_shapes(out, check_type=False, strict_mode=False)
        except Exception as e:  # noqa: BLE001
            raise ConverterError(f"the converted model fails shape inference: {str(e).splitlines()[0]}") from None
        return out

    def _pack(self, model) -> None:
        """Check the packed model's inputs against ``pack_args`` and store the settings in it."""
        import json
        pa = self.pack_args
        inits = {t.name for t in model.graph.initializer}
        ins = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input
               if vi.name not in inits}
        mask = pa.get("mask_name") or next((n for n in ins if "mask" in n.lower()), None)
        if mask not in ins:
            raise ConverterError(f"pack_args: the model has no mask input {mask!r} (inputs: {', '.join(ins)})")
        if not self.applied.get("insert_attention_mask"):
            raise ConverterError("pack_args: no attention to give the packed mask (run fused_attention first: "
                                 "--passes fused_attention)")
        dyn = pa.get("dynamic_input_name") or mask
        if dyn not in ins:
            raise ConverterError(f"pack_args: dynamic_input_name {dyn!r} is not an input of the model")
        seq = ins[mask][1] if len(ins[mask]) == 2 else None
        want = pa.get("segment_max_size")
        if seq is None or (want is not None and int(want) != seq):
            raise ConverterError(f"pack_args: segment_max_size {want} must be the sequence length of the [batch, seq] "
                                 f"mask input '{mask}' (shape {ins[mask]}); set it with input_shape")
        rec = {"mask_name": mask, "dynamic_input_name": dyn, "segment_max_size": seq,
               "max_valid_num": int(pa.get("max_valid_num", 0))}
        for p in list(model.metadata_props):
            if p.key == "poprt.pack_args":
                model.metadata_props.remove(p)
        model.metadata_props.add(key="poprt.pack_args", value=json.dumps(rec))

    # ------------------------------------------------------------------------------------
    def _shapes(self, model):
        inits = {t.name for t in model.graph.initializer}
        inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
        for k in self.input_shape:
            if k not in inputs:
                raise ConverterError(f"input_shape: the model has no input {k!r} (inputs: {', '.join(inputs)})")
        batch = self.batch_size
        if batch is None and self.input_shape:
            firsts = {v[0] for v in self.input_shape.values() if v}
            cur = {vi.type.tensor_type.shape.dim[0].dim_value for vi in inputs.values()
                   if len(vi.type.tensor_type.shape.dim)}
            if len(firsts) == 1 and cur and firsts != cur and 0 not in cur:
                batch = firsts.pop()
        if batch is not None:
            from openipu.poprt.batch import set_batch_size
            from openipu.poprt.passes.base import prune_unused
            model = set_batch_size(model, int(batch))
            prune_unused(model.graph)          # the constants of the old batch
            inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
        for k, dims in self.input_shape.items():
            d = inputs[k].type.tensor_type.shape.dim
            if len(d) != len(dims):
                raise ConverterError(f"input_shape: {k} has rank {len(d)}, got {dims}")
            for dd, v in zip(d, dims):
                dd.Clear()
                dd.dim_value = int(v)
        return model

    def _to_half(self, model):
        skip = [n for n in model.graph.node if n.op_type in self.fp16_skip_op_types]
        out = convert_float_to_half(model)
        if not skip:
            return out
        # the skipped ops run in float32: cast their float16 inputs up and their outputs down
        gv = GraphView(out.graph)
        types = self._types(model)
        skip_names = {id(n) for n in out.graph.node if n.op_type in self.fp16_skip_op_types}
        new = []
        for n in out.graph.node:
            if id(n) not in skip_names:
                new.append(n)
                continue
            for k, x in enumerate(n.input):
                if x and types.get(x) in (_F32, _F16):
                    c = gv.fresh(f"{x}_fp32")
                    new.append(onnx.helper.make_node("Cast", [x], [c], to=_F32))
                    n.input[k] = c
            tail = []
            for k, y in enumerate(n.output):
                if y and types.get(y) in (_F32, _F16):
                    c = gv.fresh(f"{y}_fp32")
                    n.output[k] = c
                    tail.append(onnx.helper.make_node("Cast", [c], [y], to=_F16))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == _F16:
                    a.i = _F32
            new.append(n)
            new.extend(tail)
        replace_repeated(out.graph.node, new)
        return out

    @staticmethod
    def _types(model) -> dict:
        """``{tensor name: ONNX element type}`` from shape inference (unknown names left out)."""
        try:
            inf = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001 - a model inference cannot follow: what it declares
            inf = model
        types = {vi.name: vi.type.tensor_type.elem_type for vi in
                 list(inf.graph.value_info) + list(inf.graph.input) + list(inf.graph.output)}
        types.update({t.name: t.data_type for t in model.graph.initializer})
        return types

    # -- fp8 -------------------------------------------------------------------------------
    def _fp8_nodes(self, model):
        gv = GraphView(model.graph)
        res = []
        for n in model.graph.node:
            if n.op_type not in _FP8_OPS or n.domain not in ("", "ai.onnx") or n.name in self.fp8_skip_op_names:
                continue
            if len(n.input) < 2 or gv.const(n.input[1]) is None:
                continue
            w = gv.const(n.input[1])
            if n.op_type == "MatMul" and w.ndim != 2:
                continue
            if n.op_type == "Gemm":
                if any(a.name == "transA" and a.i for a in n.attribute) or \
                        any(a.name in ("alpha", "beta") and a.f != 1.0 for a in n.attribute):
                    continue
                if len(n.input) > 2 and n.input[2] and gv.const(n.input[2]) is None:
                    continue
            res.append(n)
        return res

    def _calibrate(self, model) -> dict:
        """``{node output: amax of the node's input}`` for the fp8 candidates, from onnxruntime."""
        fin, _, sin, _ = self.fp8_params
        nodes = self._fp8_nodes(model)
        if sin is not None or not nodes:
            return {}
        try:
            import onnxruntime as ort
        except ImportError:
            return {}
        m = onnx.ModelProto()
        m.CopyFrom(model)
        have = {o.name for o in m.graph.output}
        want = []
        for n in nodes:
            if n.input[0] not in have:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(n.input[0]))
                have.add(n.input[0])
            want.append(n.input[0])
        feeds = self.calibration_inputs or _random_feeds(model)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - e.g. custom ops onnxruntime cannot run
            raise ConverterError(f"fp8 calibration: onnxruntime cannot run the model ({str(e).splitlines()[0]}); "
                                 f"give the input scale in fp8_params") from None
        vals = sess.run(want, {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
        return {n.output[0]: float(np.nanmax(np.abs(v))) if v.size else 0.0 for n, v in zip(nodes, vals)}

    def _to_fp8(self, model, calib):
        from openipu.popart.onnx_ops.fp8 import quantize
        import torch
        fin, fw, sin_fixed, sw_fixed = self.fp8_params
        if self.precision == "fp8_weight":
            fin = ""
        gv = GraphView(model.graph)
        dead, insert = [], []
        nodes = self._fp8_nodes(model)
        # the products' output types and shapes, from ONNX shape inference before they become
        # ai.graphcore ops (which it cannot see through): kept as value_info, so that PopART does
        # not learn them by running the fp8 host kernels on zeros at the model's batch
        want = {n.output[0] for n in nodes}
        try:
            inf = onnx.shape_inference.infer_shapes(model, strict_mode=False)
            known = {vi.name: vi for vi in list(inf.graph.value_info) + list(inf.graph.output)
                     if vi.name in want and vi.type.tensor_type.HasField("shape")
                     and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)}
        except Exception:  # noqa: BLE001 - no shapes to keep: PopART infers them
            known = {}
        for n in nodes:
            w = gv.const(n.input[1]).astype(np.float32)
            if n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute):
                w = w.T
            sw = sw_fixed if sw_fixed is not None else _scale_for(float(np.abs(w).max()), fw)
            amax = calib.get(n.output[0]) if calib else None
            sin = sin_fixed if sin_fixed is not None else (_scale_for(amax, fin) if amax and fin else 0)
            wq = quantize(torch.from_numpy(np.ascontiguousarray(w)), fw, sw).numpy().astype(np.float16)
            wname = gv.add_init(f"{n.input[1]}_fp8_{fw}", wq)
            ins = [n.input[0], wname]
            attrs = {"in_format": fin, "weight_format": fw, "in_scale": int(sin), "weight_scale": int(sw)}
            if n.op_type in ("MatMul", "Gemm"):
                if len(n.input) > 2 and n.input[2]:
                    ins.append(n.input[2])
                op = "FP8MatMul"
            else:
                if len(n.input) > 2 and n.input[2]:
                    ins.append(n.input[2])
                op = "FP8Conv"
                for a in n.attribute:
                    attrs[a.name] = onnx.helper.get_attribute_value(a)
                    if isinstance(attrs[a.name], bytes):
                        attrs[a.name] = attrs[a.name].decode()
            node = onnx.helper.make_node(op, ins, list(n.output), name=n.name or gv.fresh(f"{op}_{n.output[0]}"),
                                         domain="ai.graphcore", **attrs)
            dead.append(n)
            insert.append((node, n))
            self.applied.setdefault("fp8", []).append(n.name or n.output[0])
        from openipu.poprt.passes.base import ensure_domain, prune_unused, remove_nodes
        listed = {vi.name for vi in list(model.graph.value_info) + list(model.graph.output)}
        model.graph.value_info.extend(vi for name, vi in known.items() if name not in listed)
        if dead:
            remove_nodes(model.graph, dead, insert)
            ensure_domain(model, "ai.graphcore")
            prune_unused(model.graph)
        return model


def _fix_inputs(model) -> None:
    """Keep graph inputs and initializers consistent after rewrites: inputs naming weights that
    passes removed go; in IR < 4 models (every initializer must be an input) new initializers are
    added as inputs."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    names = {vi.name for vi in g.input}
    stale = [vi for vi in g.input if vi.name not in inits and vi.name not in used and vi.name in _ever_init(model)]
    if stale:
        keep = [vi for vi in g.input if vi not in stale]
        replace_repeated(g.input, keep)
    if model.ir_version < 4:
        for name, t in inits.items():
            if name not in names:
                g.input.append(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims)))


def _ever_init(model) -> set:
    """Graph inputs that are not run-time inputs: those not read by any node and not outputs are
    weights whose initializer a pass removed (IR < 4 lists weights as inputs)."""
    return {vi.name for vi in model.graph.input}


def _scale_for(amax, fmt: str) -> int:
    """``floor(log2(fp8_max / amax))``: the largest power-of-two scale that keeps ``amax`` in range."""
    if not amax or not math.isfinite(amax) or not fmt:
        return 0
    return int(max(-32, min(31, math.floor(math.log2(_FP8_MAX[fmt] / amax)))))


def _random_feeds(model, seed: int = 0) -> dict:
    """Seeded N(0, 1) float inputs (int inputs: zeros) with the model's static shapes (unknown
    dims: 1), for calibration."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.standard_normal(dims).astype(dt) if np.issubdtype(dt, np.floating) else np.zeros(dims, dt)
    return feeds
