"""``poprt.compiler``: compile an ONNX model to an executable for the simulated IPU, and export it.

``Compiler.compile(model, outputs, options)`` builds a PopART ``InferenceSession`` (the same IR,
lowering to PopLibs and Poplar compile as every PopART program) for the target and options in
:class:`CompilerOptions`, predicts one step on the compiled program, and returns an
:class:`Executable`. ``Compiler.compile_and_export(model, outputs, path, options)`` writes it in
openipu's executable format (:mod:`openipu.poplar.exefile`, kind ``"poprt.Executable"``; PopRT's
files are PopEF): the converted model and its options, which :class:`openipu.poprt.runtime.Runner`
compiles again when it loads the file (at once when this process compiled it).

Overlapped I/O (``num_io_tiles``). PopRT can set aside I/O tiles that receive the next batch from
the host while the compute tiles work on the current one. The model here: the program is compiled
on ``tiles - num_io_tiles`` compute tiles; one batch costs ``compute`` cycles (everything but host
exchange) and ``host_io`` cycles (the host exchange, PCIe-bound). Without I/O tiles the two add up;
with them the steady state is ``max(compute + io_to_compute, host_io)``, where ``io_to_compute``
moves the batch's input and output bytes between I/O and compute tiles over the exchange
(``bytes / (num_io_tiles * exchange_bytes_per_cycle)``). The latency of a lone batch stays
``compute + host_io + io_to_compute``. All of these are predicted IPU cycles, not host time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import onnx

from openipu.poplar import exefile

#: Kind string of PopRT executables in the executable format.
EXE_KIND = "poprt.Executable"


class CompilerOptions:
    """``poprt.compiler.CompilerOptions()``: PopRT's compiler options with their defaults.

    Fields that change the program or its predicted cost: ``num_ipus`` (1), ``ipu_version``
    (``"ipu21"``; also ``"ipu2"``, ``"bow"``, ``"ipu1"``), ``batches_per_step`` (1),
    ``partials_type`` (``"half"``, PopRT's default, or ``"float"``; ``""`` leaves PopLibs' own
    default, float; float inputs always accumulate in float), ``num_io_tiles`` (0;
    overlapped I/O, see the module docstring), ``available_memory_proportion`` (0.6),
    ``enable_pipelining`` (False; needs ``num_ipus > 1``), ``virtual_graph_mode`` (``"off"``,
    ``"auto"``, ``"manual"``), ``stream_buffering_depth`` (1: batches of inputs and outputs the I/O
    tiles buffer; with I/O tiles, ``depth x (input + output bytes per batch)`` must fit in them, else
    compiling fails as out of memory), ``constant_weights`` (True),
    ``enable_engine_caching`` / ``cache_path`` (PopART's engine cache). The other fields PopRT has
    are accepted and stored in the executable. Setting an unknown field raises ``AttributeError``
    (as the C++ binding does).
    """

    _DEFAULTS = {
        "num_ipus": 1, "ipu_version": "ipu21", "batches_per_step": 1, "partials_type": "half", "num_io_tiles": 0,
        "available_memory_proportion": 0.6, "enable_pipelining": False, "virtual_graph_mode": "off",
        "stream_buffering_depth": 1, "enable_engine_caching": False, "cache_path": "session_cache",
        "constant_weights": True,
        # accepted and stored
        "enable_prefetch_datastreams": True, "rearrange_anchors_on_host": True, "rearrange_streams_on_host": False,
        "group_host_sync": False, "enable_fast_reduce": False, "enable_non_stable_softmax": False,
        "use_128bit_conv_unit_load": False, "enable_outlining": False, "outline_threshold": 1.0,
        "enable_multi_stage_reduce": True, "show_compilation_progress_bar": True, "time_limit_scheduler": 1e9,
        "swap_limit_scheduler": 1e9, "transitive_closure_optimization_threshold": 100000, "opaque_blobs": True,
        "num_iterations": 1, "replication_factor": 1, "custom_patterns": [], "serialize_matmul": {},
        "max_tensor_size": -1, "engine_options": {}, "popart_options": {},
    }

    def __init__(self, **kwargs):
        for k, v in self._DEFAULTS.items():
            object.__setattr__(self, k, v.copy() if isinstance(v, (list, dict)) else v)
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __setattr__(self, k, v):
        if k not in self._DEFAULTS:
            raise AttributeError(f"'poprt.compiler.CompilerOptions' object has no attribute '{k}'")
        object.__setattr__(self, k, v)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._DEFAULTS}

    @classmethod
    def from_dict(cls, d: dict) -> "CompilerOptions":
        """Options from a dict (e.g. Byte MLPerf's ``interact_infos`` JSON); ``num_iotiles`` is
        read as ``num_io_tiles``; keys that are not compiler options raise ``AttributeError``."""
        o = cls()
        for k, v in d.items():
            setattr(o, {"num_iotiles": "num_io_tiles"}.get(k, k), v)
        return o

    def __repr__(self):
        changed = {k: v for k, v in self.to_dict().items() if v != self._DEFAULTS[k]}
        return f"CompilerOptions({changed})"


@dataclass
class TensorDesc:
    """A model input or output as the runtime sees it: ``name``, ``shape`` (list of ints, the
    batch included), ``dtype`` (numpy dtype of the host buffer). ``numpy_data_type()`` as PopRT."""

    name: str
    shape: list
    dtype: str
    size: int = 0           # bytes per execute

    def numpy_data_type(self):
        return np.dtype(self.dtype).type

    @property
    def data_type(self) -> str:
        return np.dtype(self.dtype).name

    def __repr__(self):
        return f"TensorDesc(name={self.name!r}, shape={self.shape}, dtype={np.dtype(self.dtype).name})"


@dataclass
class Prediction:
    """Predicted IPU figures of one execute (``batches_per_step`` batches), in IPU cycles and
    seconds at the target clock. Not host time."""

    clock_hz: float
    batch_size: int
    batches_per_step: int
    step_cycles: float           # one step as simulated (host I/O not overlapped)
    compute_cycles: float        # per batch, all but host exchange
    host_io_cycles: float        # per batch, host exchange
    io_to_compute_cycles: float  # per batch, I/O tiles <-> compute tiles (0 without I/O tiles)
    num_io_tiles: int
    by_category: dict = field(default_factory=dict)

    @property
    def latency_cycles(self) -> float:
        """One batch alone: compute, host I/O and the I/O-tile transfer in sequence."""
        return self.compute_cycles + self.host_io_cycles + self.io_to_compute_cycles

    @property
    def batch_period_cycles(self) -> float:
        """Steady state, batch after batch: overlapped with I/O tiles, serial without."""
        if self.num_io_tiles:
            return max(self.compute_cycles + self.io_to_compute_cycles, self.host_io_cycles)
        return self.latency_cycles

    @property
    def latency_seconds(self) -> float:
        return self.latency_cycles / self.clock_hz

    @property
    def qps(self) -> float:
        """Predicted samples per second in steady state on the IPU."""
        return self.batch_size * self.clock_hz / max(self.batch_period_cycles, 1.0)

    def summary(self, ipu_version: str) -> str:
        """One line of the predicted figures and the configuration they assume (predicted IPU time,
        not host time)."""
        period = self.batch_period_cycles / self.clock_hz
        io = (f"{self.num_io_tiles} I/O tiles, overlapped I/O" if self.num_io_tiles
              else "no I/O tiles, I/O not overlapped")
        return (f"predicted IPU ({ipu_version}, batch {self.batch_size}, batches_per_step {self.batches_per_step}, "
                f"{io}): latency {self.latency_seconds * 1e3:.3f} ms, one batch every {period * 1e3:.3f} ms in "
                f"steady state, {self.qps:,.0f} samples/s")

    def to_dict(self) -> dict:
        return {"clock_hz": self.clock_hz, "batch_size": self.batch_size, "batches_per_step": self.batches_per_step,
                "step_cycles": self.step_cycles, "compute_cycles": self.compute_cycles,
                "host_io_cycles": self.host_io_cycles, "io_to_compute_cycles": self.io_to_compute_cycles,
                "num_io_tiles": self.num_io_tiles, "by_category": dict(self.by_category)}


class Executable:
    """A compiled PopRT model: the lowered PopART program (Poplar graph, programs, stream handles),
    the input and output descriptors, the options and the predicted figures.

    ``save(path)`` writes the model and its options in openipu's executable format (kind
    ``poprt.Executable``); ``Executable.load(path)`` compiles that model again with those options
    (a model is untrusted input checked as any model is), unless this process compiled the same
    model and options and still holds the result. Raises
    :class:`openipu.poplar.exefile.executable_file_error` (a ``poplar_error``) for bad files.
    """

    def __init__(self, lowered, inputs: list, outputs: list, options: dict, target: dict, prediction: Prediction,
                 host_weights: dict | None = None, compile_seconds: float = 0.0, compiled=None,
                 model_bytes: bytes = b"", output_names: list | None = None):
        self.lowered = lowered
        self.compiled = compiled      # the Poplar step tree
        self.inputs, self.outputs = inputs, outputs
        self.options, self.target = options, target
        self.prediction = prediction
        self.host_weights = host_weights or {}
        self.compile_seconds = compile_seconds
        self.model_bytes = model_bytes
        self.output_names = list(output_names) if output_names is not None else [d.name for d in outputs]

    def _meta(self) -> dict:
        return {"inputs": [vars(d) for d in self.inputs], "outputs": [vars(d) for d in self.outputs],
                "options": _jsonable(self.options), "target": self.target, "prediction": self.prediction.to_dict(),
                "compile_seconds": self.compile_seconds}

    def save(self, path) -> None:
        """Write ``model.onnx`` (the converted model) and ``poprt.json`` (output names and compiler
        options) to ``path``; the manifest's meta holds the descriptors and the prediction."""
        options = _jsonable({k: v for k, v in self.options.items() if k != "pack_args"})
        record = {"outputs": self.output_names, "options": options, "pack_args": self.options.get("pack_args")}
        exefile.write(path, EXE_KIND, {"model.onnx": self.model_bytes, "poprt.json": record}, self._meta())

    @classmethod
    def load(cls, path) -> "Executable":
        contents = exefile.read(path, EXE_KIND)
        what = f"'{contents.fname}'"
        record = contents.json("poprt.json")
        model = bytes(contents.bytes("model.onnx"))
        if not (isinstance(record, dict) and isinstance(record.get("outputs"), list)
                and all(isinstance(x, str) for x in record["outputs"]) and isinstance(record.get("options"), dict)):
            raise exefile.executable_file_error(f"{what}: the PopRT record is malformed")
        options = _options_from_record(record["options"], what)
        key = _compile_key(model, record)
        exe = _COMPILED.get(key)
        if exe is None:
            try:
                exe = Compiler.compile(model, record["outputs"], options)
            except exefile.executable_file_error:
                raise
            except Exception as e:  # noqa: BLE001 - the model is untrusted: any refusal is a bad file
                raise exefile.executable_file_error(f"{what}: its model does not compile "
                                                    f"({type(e).__name__}: {e})") from None
        pack = record.get("pack_args")
        if pack is not None:
            if not isinstance(pack, dict):
                raise exefile.executable_file_error(f"{what}: pack_args is not an object")
            exe.options = {**exe.options, "pack_args": pack}
        return exe


#: Executables this process compiled, by model and options (while something holds them), so that
#: loading a file this process just wrote does not compile the model a second time.
_COMPILED: "weakref.WeakValueDictionary[str, Executable]" = weakref.WeakValueDictionary()
#: The last executables ``compile_and_export`` wrote (kept alive for a load in this process).
_RECENT_EXPORTS: list = []


def _compile_key(model_bytes: bytes, record: dict) -> str:
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps([record.get("outputs"), record.get("options")], sort_keys=True).encode())
    return h.hexdigest()


def _options_from_record(d: dict, what: str) -> "CompilerOptions":
    """:class:`CompilerOptions` from a file's record, each value of its default's type."""
    o = CompilerOptions()
    for k, v in d.items():
        if k not in CompilerOptions._DEFAULTS:
            raise exefile.executable_file_error(f"{what}: unknown compiler option {str(k)[:40]!r}")
        default = CompilerOptions._DEFAULTS[k]
        want = (int, float) if type(default) is float else type(default)
        if type(default) is int and type(v) is bool or not isinstance(v, want) or (
                isinstance(v, float) and not math.isfinite(v)):
            raise exefile.executable_file_error(f"{what}: compiler option {k} is a {type(v).__name__}, not a "
                                                f"{type(default).__name__}")
        if isinstance(v, (dict, list)) and len(json.dumps(v)) > 1 << 20:
            raise exefile.executable_file_error(f"{what}: compiler option {k} is too large")
        if k in ("engine_options", "popart_options"):
            bad = [str(x) for x in v if _WRITES_FILES.search(str(x))]
            if bad:
                raise exefile.executable_file_error(f"{what}: {k} sets {bad[0][:60]!r}, which writes files; an "
                                                    "executable file may not")
        setattr(o, k, v)
    o.enable_engine_caching = False            # loading a file never writes one
    return o


#: Option names that make a compile write files (profiles, caches, logs): refused in files.
_WRITES_FILES = re.compile(r"(?i)(dir|path|file|cache|log|report|profil|debug|serializ)")


def _jsonable(d):
    if isinstance(d, dict):
        return {str(k): _jsonable(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_jsonable(v) for v in d]
    if d is None or isinstance(d, (bool, int, float, str)):
        return d
    return str(d)


def _load_model(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        m = onnx.ModelProto()
        try:
            m.ParseFromString(bytes(model))
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError
            raise ValueError(f"The model bytes are not an ONNX ModelProto ({e})") from None
        return m
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"No ONNX model at '{os.fspath(model)}'")
        return onnx.load(os.fspath(model))
    raise TypeError(f"model must be an onnx.ModelProto, its serialized bytes or a path, not {type(model).__name__}")


_NP = {"FLOAT": "float32", "FLOAT16": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool",
       "UINT8": "uint8", "INT8": "int8", "INT16": "int16", "UINT16": "uint16", "UINT32": "uint32",
       "DOUBLE": "float64", "UINT64": "uint64"}


class Compiler:
    """``poprt.compiler.Compiler``: ``compile`` and ``compile_and_export`` (static methods)."""

    @staticmethod
    def compile(model, outputs=None, options: CompilerOptions | None = None) -> Executable:
        """Compile ``model`` for the simulated IPU.

        Args:
            model: ``onnx.ModelProto``, its serialized bytes, or a path. Inputs must have static
                shapes (use ``Converter(input_shape=...)`` / ``set_batch_size`` first).
            outputs: output names to return (default: every graph output).
            options: :class:`CompilerOptions` (default ``CompilerOptions()``: one ipu21).
        Returns:
            An :class:`Executable` with its predicted figures (IPU cycles, not host time).
        Raises:
            ValueError / TypeError / FileNotFoundError for a bad model or options; PopART's
            exceptions (``popart_exception``, ``OutOfMemoryException`` ...) from compiling.
        """
        import openipu.popart as popart
        from openipu.ipu import target as ipu_target
        from openipu.popart.dataflow import anchor_shape
        from openipu.poplar.profile import run_breakdown

        o = options if options is not None else CompilerOptions()
        if not isinstance(o, CompilerOptions):
            raise TypeError(f"options must be a poprt.compiler.CompilerOptions, not {type(o).__name__}")
        proto = _load_model(model)
        if isinstance(outputs, str):
            outputs = [outputs]
        outputs = list(outputs) if outputs else [x.name for x in proto.graph.output]
        if o.ipu_version not in ("ipu1", "ipu2", "bow", "ipu21"):
            raise ValueError(f"ipu_version must be one of ipu1, ipu2, bow, ipu21, not '{o.ipu_version}'")
        n_ipus, bps, io_tiles = int(o.num_ipus), int(o.batches_per_step), int(o.num_io_tiles)
        spec = ipu_target(o.ipu_version)
        if n_ipus < 1 or bps < 1:
            raise ValueError("num_ipus and batches_per_step must be at least 1")
        if not 0 <= io_tiles < spec.tiles_per_ipu // 2:
            raise ValueError(f"num_io_tiles must be between 0 and {spec.tiles_per_ipu // 2 - 1}, not {io_tiles}")
        if o.partials_type not in ("", "half", "float"):
            raise ValueError(f"partials_type must be 'half' or 'float', not '{o.partials_type}'")
        if o.enable_pipelining and n_ipus < 2:
            raise ValueError("enable_pipelining needs num_ipus > 1")

        opts = popart.SessionOptions()
        amp = str(float(o.available_memory_proportion))
        conv = {"availableMemoryProportion": amp}
        mm = {"availableMemoryProportion": amp}
        if o.partials_type:
            conv["partialsType"] = o.partials_type
            mm["partialsType"] = o.partials_type
            opts.partialsTypeMatMuls = o.partials_type
        opts.convolutionOptions, opts.matmulOptions = conv, mm
        opts.constantWeights = bool(o.constant_weights)
        opts.defaultBufferingDepth = int(o.stream_buffering_depth)
        opts.enablePrefetchDatastreams = bool(o.enable_prefetch_datastreams)
        opts.numIOTiles = io_tiles
        opts.enableEngineCaching = bool(o.enable_engine_caching)
        opts.cachePath = str(o.cache_path)
        opts.engineOptions = {str(k): str(v) for k, v in dict(o.engine_options).items()}
        mode = str(o.virtual_graph_mode).lower()
        if n_ipus > 1:
            opts.virtualGraphMode = popart.VirtualGraphMode.Manual if mode == "manual" else popart.VirtualGraphMode.Auto
            opts.enablePipelining = bool(o.enable_pipelining)
        for k, v in dict(o.popart_options).items():
            setattr(opts, k, v)
        dev = popart.DeviceManager().createIpuModelDevice(
            {"numIPUs": n_ipus, "ipuVersion": o.ipu_version, "tilesPerIPU": spec.tiles_per_ipu - io_tiles})
        flow = popart.DataFlow(bps, {name: popart.AnchorReturnType("ALL") for name in outputs})
        t0 = time.perf_counter()
        session = popart.InferenceSession(fnModel=proto.SerializeToString(), dataFlow=flow, deviceInfo=dev,
                                          userOptions=opts)
        session.prepareDevice(loadEngine=False)
        compile_seconds = time.perf_counter() - t0
        engine, ir, low = session._engine, session._ir, session._lowered

        inputs = []
        for tid in ir.stream_inputs:
            info = ir.info(tid)
            shape = ([bps] if bps > 1 else []) + list(info.shape())
            dt = _NP[info.data_type()]
            inputs.append(TensorDesc(tid, shape, dt, int(np.prod(shape)) * np.dtype(dt).itemsize))
        outs = []
        for tid in outputs:
            info = ir.info(tid)
            shape = anchor_shape(flow.art(tid), info.shape(), bps, 1, 1)
            dt = _NP[info.data_type()]
            outs.append(TensorDesc(tid, list(shape), dt, int(np.prod(shape)) * np.dtype(dt).itemsize))

        engine.predict_run(0)
        b = run_breakdown(engine)
        batch = inputs[0].shape[1 if bps > 1 else 0] if inputs and inputs[0].shape else 1
        host_io = b["by_category"].get("host_exchange", 0.0) / bps
        compute = max(b["cycles"] / bps - host_io, 0.0)
        io_bytes = sum(d.size for d in inputs + outs) / bps
        xfer = io_bytes / (io_tiles * spec.exchange_bytes_per_cycle) if io_tiles else 0.0
        depth = max(1, int(o.stream_buffering_depth))
        if io_tiles and depth * io_bytes > io_tiles * spec.bytes_per_tile:
            raise popart.popart_exception(
                f"Out of memory on the I/O tiles: {depth} buffered batch(es) of inputs and outputs need "
                f"{int(depth * io_bytes):,} bytes but {io_tiles} I/O tiles hold {io_tiles * spec.bytes_per_tile:,}. "
                "Raise num_io_tiles, lower stream_buffering_depth or the batch size")
        pred = Prediction(float(spec.clock_hz), int(batch), bps, float(b["cycles"]), compute, host_io, float(xfer),
                          io_tiles, {k: float(v) for k, v in b["by_category"].items()})
        target = {"ipu_version": o.ipu_version, "num_ipus": n_ipus, "tiles_per_ipu": spec.tiles_per_ipu,
                  "compute_tiles_per_ipu": spec.tiles_per_ipu - io_tiles, "clock_hz": float(spec.clock_hz)}
        weights = {tid: session._host_weights[tid] for tid in low.weights_in}
        options = o.to_dict()
        pack = next((p.value for p in proto.metadata_props if p.key == "poprt.pack_args"), None)
        if pack:        # a model converted with pack_args: PackRunner's defaults
            options["pack_args"] = json.loads(pack)
        exe = Executable(low, inputs, outs, options, target, pred, weights, compile_seconds, engine._exe.compiled,
                         proto.SerializeToString(), outputs)
        exe._session = session      # its IR, for runners on the IR executor (not part of the file)
        _COMPILED[_compile_key(exe.model_bytes, {"outputs": list(outputs), "options": _jsonable(o.to_dict())})] = exe
        return exe

    @staticmethod
    def compile_and_export(model, outputs=None, path=None, options: CompilerOptions | None = None) -> None:
        """Compile and write the executable to ``path`` (PopRT: ``compile_and_export(model_bytes,
        outputs, popef_path, options)``; ``compile_and_export(model, path, options)`` also works).
        Raises as :meth:`compile`, and ``executable_file_error`` if it cannot be written."""
        if isinstance(outputs, (str, os.PathLike)) and (path is None or isinstance(path, CompilerOptions)):
            outputs, path, options = None, outputs, path if isinstance(path, CompilerOptions) else options
        if path is None:
            raise ValueError("compile_and_export needs the path of the executable file to write")
        d = os.path.dirname(os.fspath(path))
        if d:
            os.makedirs(d, exist_ok=True)
        exe = Compiler.compile(model, outputs, options)
        exe.save(path)
        # held, so that loading the file in this process (PopRT's compile-then-Runner flow, as Byte
        # MLPerf's backend does) takes this compile from _COMPILED instead of compiling again
        _RECENT_EXPORTS.append(exe)
        del _RECENT_EXPORTS[:-2]
