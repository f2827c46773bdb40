"""``PoplarExecutor``'s executable files: ``save`` / ``compileAndExport`` write the compiled
model in openipu's safe format (:mod:`openipu.poptorch.export`), ``loadExecutable`` uses one."""

from __future__ import annotations

import inspect
import io

from openipu import popart
from openipu.poptorch import capture as cap
from openipu.poptorch._weights import _is_param, _to_numpy
from openipu.poptorch.errors import Error
from openipu.poptorch.lower import POPART_TYPE


class ExecutableFiles:
    """``PoplarExecutor``'s file methods (mixed into it)."""

    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Save the compiled model to ``filename`` (a directory gets ``model.poptorch``) in
        openipu's safe format (:mod:`openipu.poptorch.export`: JSON, the ONNX model and the
        weights; no pickle). ``export_model``: :func:`poptorch.load` may rebuild the wrapper from
        the file alone (else wrap the model again and call :meth:`loadExecutable`)."""
        from openipu.poptorch import __version__, export
        self._check_compiled()
        if self._training and self._attached and not self._connection_never():
            self.copyWeightsToHost()
        b = self._built
        weights = {tid: _to_numpy(self._module_tensor(p), POPART_TYPE[self._module_tensor(p).dtype])
                   for tid, p in b.weights.items()}
        want, others = self._signature
        params = {p: n for n, p in self._user_model.named_parameters()}
        meta = {"poptorch_version": __version__, "training": self._training, "export_model": bool(export_model),
                "options": export.options_to_json(self._options),
                "signature": [[n, list(shape), str(dt)] for n, shape, dt in want], "others": export.encode(others),
                "inputs": list(b.inputs), "input_info": [[i.data_type(), list(i.shape())] for i in b.input_info],
                "outputs": list(b.outputs), "out_spec": export.spec_dumps(b.out_spec), "loss": b.loss,
                "weights": dict(b.weights), "params": [p for p in b.weights.values() if _is_param(self._user_model, p)],
                "forward": _forward_signature(self._user_model),
                "num_ipus": b.num_ipus, "pipelined": b.pipelined,
                "input_mutations": [[int(k), str(t)] for k, t in b.input_mutations],
                "rng_state": self.rng_state if save_rng_state else None,
                "optimizer": export.optimizer_to_json(self._optimizer, params) if self._training else None}
        buf = io.BytesIO()
        try:
            self._session._save_lowered(buf)
            exe = buf.getvalue()
        except popart.popart_exception:      # a kernel that cannot be named: the file recompiles
            exe = None
        export.write(filename, meta, b.model, weights, exe)

    def compileAndExport(self, filename: str, *args, export_model: bool = True, **kwargs) -> None:  # noqa: N802
        """Compile for these inputs (without running) and :meth:`save` to ``filename``."""
        self.compile(*args, **kwargs)
        self.save(filename, export_model)

    def loadExecutable(self, filename: str) -> None:  # noqa: N802
        """Use the model compiled in ``filename`` (:meth:`save` / :meth:`compileAndExport`) with
        this wrapper's user model: its weights (not the file's) go to the device."""
        from openipu.poptorch import export
        meta, model_bytes, _ = export.read(filename)
        if bool(meta["training"]) != self._training:
            kind = "training" if meta["training"] else "inference"
            raise Error(f"Invalid file {filename}: it holds a {kind} model, this wrapper is not one")
        for p in meta["weights"].values():
            try:
                self._module_tensor(p)
            except AttributeError:
                raise Error(f"Invalid file {filename}: the model has no parameter or buffer '{p}'") from None
        self._install(meta, model_bytes, export.read_executable(filename))

    def _install(self, meta: dict, model_bytes: bytes, executable: bytes | None = None) -> None:
        """The saved executable (or, if it does not match, the saved ONNX model compiled again) as
        this wrapper's executable."""
        from openipu.poptorch import export
        built = cap.Built(model_bytes, list(meta["inputs"]),
                          [popart.TensorInfo(dt, shape) for dt, shape in meta["input_info"]], list(meta["outputs"]),
                          export.spec_loads(meta["out_spec"]), meta["loss"], dict(meta["weights"]),
                          int(meta["num_ipus"]), bool(meta["pipelined"]), _input_mutations(meta))
        self._built = built
        self._signature = ([(n, tuple(shape), export._DTYPES[dt]) for n, shape, dt in meta["signature"]],
                           export.decode(meta["others"]))
        self._session = None
        self._make_session(built, executable)
        if meta.get("rng_state"):
            self.rng_state = meta["rng_state"]


def _input_mutations(meta: dict) -> list:
    """The saved ``[[input index, output id]]`` of inputs changed in place (files of an older
    openipu have none). Raises :class:`Error` for a malformed entry."""
    raw = meta.get("input_mutations") or []
    if not isinstance(raw, list) or not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], int) and
                                            isinstance(e[1], str) and 0 <= e[0] < len(meta["inputs"])
                                            for e in raw):
        raise Error("Invalid file: malformed input_mutations")
    return [(k, t) for k, t in raw]


def _forward_signature(model) -> list:
    """``forward``'s parameters as JSON: ``[name, kind, has_default, default]``."""
    from openipu.poptorch import export
    out = []
    for p in inspect.signature(model.forward).parameters.values():
        has, default = p.default is not inspect.Parameter.empty, None
        if has:
            try:
                default = export.encode(p.default)
            except Error:
                has = False
        out.append([p.name, p.kind.name, has, default])
    return out
