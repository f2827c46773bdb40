"""The ``poprt`` command line (PopRT's CLI): convert an ONNX model, optionally compile it to an
executable file.

    poprt --input_model M.onnx --output_model M_fp16.onnx --precision fp16
    poprt -i M.onnx --precision fp8 --ipu_version ipu21 --export_popef --output_dir out/
    poprt --list_all_passes

Flags (PopRT's names): ``--input_model/-i``, ``--output_model``, ``--output_dir``,
``--input_shape NAME=D0,D1 ...``, ``--batch_size``, ``--precision {fp32,fp16,fp8,fp8_weight}``,
``--fp16_skip_op_types``, ``--fp8_skip_op_names``, ``--fp8_params``, ``--convert_version``,
``--passes`` / ``--skip_passes`` (comma-separated), ``--list_all_passes``, ``--ipu_version
{ipu2,ipu21}``, ``--export_popef`` (``openipu.poprt.compiler.Compiler.compile_and_export``; the
file is ``<output model stem>.popef`` next to the output model), ``--batches_per_step``,
``--available_memory_proportion``, ``--num_io_tiles``, ``--compiler_options KEY=VAL ...``
(``CompilerOptions`` fields), ``--popart_options KEY=VAL ...`` (PopART ``SessionOptions``),
``--logging_level``.

Graph rewrites (:mod:`openipu.poprt.passes.matmul`, :mod:`openipu.poprt.passes.graph`):
``--serialize_matmul NAME=FACTOR[/MODE] ...`` and ``--serialize_matmul_add`` (modes
``output_channels``, ``input_channels``, ``reducing_dim``), ``--merge_matmul A,B,C[;D,E]`` and
``--merge_matmul_add``, ``--max_tensor_size BYTES`` (constant folding up to that size; ``-1``: no
limit), ``--checkpoints T1,T2`` (extra outputs), ``--pack_args max_valid_num=N
segment_max_size=S [mask_name=M] [dynamic_input_name=D]`` (packed sequences: the
``insert_attention_mask`` pass and the settings :class:`openipu.poprt.runtime.PackRunner` reads),
``--custom_pass_config FILE`` (YAML or JSON, read with ``yaml.safe_load``: a list of ``{name:
PASS, KEY: VAL ...}`` or a mapping ``{PASS: {KEY: VAL}}``, run after ``--passes``).

Flags that cannot work on the simulator stop with a one-line error saying why:
``--custom_library_so_paths`` (compiled C++ PopART ops / patterns / transforms), ``--custom_shape_inference``
(shape functions of such ops) and ``--merge_moe`` (needs PopRT's grouped-MatMul MoE op).

The default output model is ``<output_dir>/<input stem>.<precision>.onnx`` (``output_dir``
default: the current directory). Exit status 0 on success; 2 for a bad flag; 1 for an error
of the conversion or compilation (unknown pass, fp8 on ipu2, a bad model). Errors are one line on
standard error: ``poprt: error: ...``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the brief's CLI contract asks
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="poprt", description="PopRT: convert an ONNX model for the (simulated) IPU and compile it.")
    p.add_argument("-i", "--input_model", help="the ONNX model to convert")
    p.add_argument("--output_model", help="path of the converted model (default <output_dir>/<stem>.<precision>.onnx)")
    p.add_argument("--output_dir", default=".", help="directory of the outputs (default: current directory)")
    p.add_argument("--input_shape", nargs="+", metavar="NAME=D0,D1", help="static shapes of inputs")
    p.add_argument("--batch_size", type=int, help="the first dimension of every input")
    p.add_argument("--batch_axis", type=int, default=0, help="the batch axis (only 0 is supported)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "fp8", "fp8_weight"])
    p.add_argument("--fp16_skip_op_types", default="", help="op types kept in fp32, comma-separated")
    p.add_argument("--fp8_skip_op_names", default="", help="node names kept in fp16, comma-separated")
    p.add_argument("--fp8_params", default=None, help="'F143,F143,-3,-3': formats and power-of-two scales")
    p.add_argument("--convert_version", type=int, help="convert to this ai.onnx opset")
    p.add_argument("--passes", default="", help="passes to run, comma-separated (see --list_all_passes)")
    p.add_argument("--skip_passes", default="", help="passes not to run, comma-separated")
    p.add_argument("--list_all_passes", action="store_true", help="print the registered passes and exit")
    p.add_argument("--ipu_version", default="ipu21", choices=["ipu2", "ipu21"])
    p.add_argument("--export_popef", action="store_true", help="also compile to an executable file (.popef)")
    p.add_argument("--batches_per_step", type=int)
    p.add_argument("--available_memory_proportion", type=float)
    p.add_argument("--num_io_tiles", type=int)
    p.add_argument("--compiler_options", nargs="+", metavar="KEY=VAL", default=[])
    p.add_argument("--popart_options", nargs="+", metavar="KEY=VAL", default=[])
    p.add_argument("--serialize_matmul", nargs="+", metavar="NAME=FACTOR[/MODE]", default=[],
                   help="split MatMuls into FACTOR serial parts (modes output_channels, input_channels, reducing_dim)")
    p.add_argument("--serialize_matmul_add", nargs="+", metavar="NAME=FACTOR[/MODE]", default=[],
                   help="as --serialize_matmul, for a MatMul followed by a bias Add")
    p.add_argument("--merge_matmul", default="", help="MatMuls sharing an input to merge: A,B,C[;D,E]")
    p.add_argument("--merge_matmul_add", default="", help="MatMul + bias Add pairs sharing an input to merge")
    p.add_argument("--merge_moe", default="", help="not available on the simulator")
    p.add_argument("--max_tensor_size", type=int, help="fold constants up to this many bytes (-1: no limit)")
    p.add_argument("--checkpoints", default="", help="tensors to add as outputs, comma-separated")
    p.add_argument("--pack_args", nargs="+", metavar="KEY=VAL", default=[],
                   help="packed sequences: max_valid_num, segment_max_size, mask_name, dynamic_input_name")
    p.add_argument("--custom_pass_config", help="YAML / JSON file of passes and their arguments")
    p.add_argument("--custom_library_so_paths", nargs="+", default=[], help="not available on the simulator")
    p.add_argument("--custom_shape_inference", default="", help="not available on the simulator")
    p.add_argument("--logging_level", default="warning", choices=["debug", "info", "warning", "error", "critical"])
    return p


def _kv(items, flag) -> dict:
    out = {}
    for it in items:
        if "=" not in it:
            raise _CliError(f"{flag}: expected KEY=VAL, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = _value(v.strip())
    return out


def _value(v: str):
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def _shapes(items) -> dict:
    out = {}
    for it in items or []:
        name, sep, dims = it.rpartition("=")
        if not sep or not name:
            raise _CliError(f"--input_shape: expected NAME=D0,D1,..., got {it!r}")
        try:
            out[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise _CliError(f"--input_shape: dimensions of {name} must be integers, got {dims!r}") from None
    return out


class _CliError(Exception):
    pass


def _pass_config(path) -> list:
    """``[(pass name, kwargs), ...]`` from a YAML or JSON file (``yaml.safe_load``: data only, no
    code): a list of ``{name: PASS, KEY: VAL ...}`` (or of names), ``{passes: [...]}``, or a
    mapping ``{PASS: {KEY: VAL}}``."""
    import yaml
    if not os.path.isfile(path):
        raise _CliError(f"--custom_pass_config: no such file {path!r}")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as e:
        raise _CliError(f"--custom_pass_config: {path!r} is not YAML or JSON ({str(e).splitlines()[0]})") from None
    if isinstance(data, dict) and "passes" in data:
        data = data["passes"]
    out = []
    if isinstance(data, dict):
        for name, kw in data.items():
            if kw is not None and not isinstance(kw, dict):
                raise _CliError(f"--custom_pass_config: the arguments of pass {name!r} must be a mapping")
            out.append((str(name), dict(kw or {})))
    elif isinstance(data, list):
        for item in data:
            if isinstance(item, str):
                out.append((item, {}))
            elif isinstance(item, dict) and "name" in item:
                kw = dict(item)
                out.append((str(kw.pop("name")), kw))
            else:
                raise _CliError(f"--custom_pass_config: each entry needs a pass 'name', got {item!r}")
    else:
        raise _CliError("--custom_pass_config: expected a list of passes or a mapping of pass names to arguments")
    return out


def run(args) -> int:
    """Run the CLI on parsed ``args``; returns the exit status (errors raise)."""
    import logging

    import onnx

    from openipu.poprt.converter import Converter
    from openipu.poprt.passes import get_registered_passes

    logging.getLogger("poprt").setLevel(args.logging_level.upper())
    if args.list_all_passes:
        for name, cls in get_registered_passes().items():
            doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
            print(f"{name:32s} {doc}")
        return 0
    if not args.input_model:
        raise _CliError("the following arguments are required: --input_model/-i")
    if not os.path.isfile(args.input_model):
        raise _CliError(f"--input_model: no such file {args.input_model!r}")
    if args.batch_axis != 0:
        raise _CliError("--batch_axis: only 0 is supported")
    if args.custom_library_so_paths:
        raise _CliError("--custom_library_so_paths: compiled C++ libraries (PopART custom ops, patterns, transforms) "
                        "cannot be loaded into the simulator; write the op as a Python kernel "
                        "(openipu.popart.onnx_ops.onnx_op) or the rewrite as a pass (poprt.passes.register)")
    if args.custom_shape_inference:
        raise _CliError("--custom_shape_inference: shape functions belong to C++ custom ops, which the simulator "
                        "cannot load; a Python op kernel (openipu.popart.onnx_ops.onnx_op) gives its output shapes")
    if args.merge_moe:
        raise _CliError("--merge_moe: merging mixture-of-experts MatMuls needs PopRT's grouped-MatMul MoE op, which "
                        "openipu does not have; use --merge_matmul for MatMuls that read the same input")
    passes = [s.strip() for s in args.passes.split(",") if s.strip()]
    conv = Converter(input_shape=_shapes(args.input_shape), batch_size=args.batch_size, precision=args.precision,
                     fp16_skip_op_types=args.fp16_skip_op_types, fp8_skip_op_names=args.fp8_skip_op_names,
                     fp8_params=args.fp8_params, ipu_version=args.ipu_version, convert_version=args.convert_version,
                     used_passes=passes, skip_passes=args.skip_passes,
                     pass_config=_pass_config(args.custom_pass_config) if args.custom_pass_config else None,
                     merge_matmul=args.merge_matmul, merge_matmul_add=args.merge_matmul_add,
                     serialize_matmul=args.serialize_matmul, serialize_matmul_add=args.serialize_matmul_add,
                     max_tensor_size=args.max_tensor_size, checkpoints=args.checkpoints,
                     pack_args=_kv(args.pack_args, "--pack_args"))
    compiler_options = _kv(args.compiler_options, "--compiler_options")
    popart_options = _kv(args.popart_options, "--popart_options")
    try:
        model = onnx.load(args.input_model)
    except Exception as e:  # noqa: BLE001 - any decode failure is a bad input file
        raise _CliError(f"--input_model: cannot read {args.input_model!r} as ONNX: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    out = conv.convert(model)
    out_dir = Path(args.output_dir)
    out_path = Path(args.output_model) if args.output_model else out_dir / f"{Path(args.input_model).stem}.{args.precision}.onnx"
    if not out_path.is_absolute() and args.output_model and args.output_dir != "." and out_path.parent == Path("."):
        out_path = out_dir / out_path
    out_path.parent.mkdir(parents=True, exist_ok=True)
    big = out.ByteSize() > 1_900_000_000
    onnx.save(out, str(out_path), save_as_external_data=big)
    applied = {k: len(v) for k, v in conv.applied.items()}
    print(f"poprt: wrote {out_path} (precision {args.precision}" +
          (f"; rewrites: {', '.join(f'{k} {v}' for k, v in applied.items())}" if applied else "") + ")")
    if args.export_popef:
        try:
            from openipu.poprt.compiler import Compiler, CompilerOptions
        except ImportError:
            raise _CliError("--export_popef needs openipu.poprt.compiler, which this build does not have") from None
        opts = CompilerOptions()
        fields = {"ipu_version": args.ipu_version}
        if args.batches_per_step is not None:
            fields["batches_per_step"] = args.batches_per_step
        if args.available_memory_proportion is not None:
            fields["available_memory_proportion"] = args.available_memory_proportion
        if args.num_io_tiles is not None:
            fields["num_io_tiles"] = args.num_io_tiles
        fields.update(compiler_options)
        for k, v in fields.items():
            try:
                setattr(opts, k, v)
            except AttributeError:
                raise _CliError(f"--compiler_options: CompilerOptions has no field {k!r}") from None
        if popart_options:
            try:
                opts.popart_options = popart_options
            except AttributeError:
                raise _CliError("--popart_options: this build's CompilerOptions takes no PopART options") from None
        popef = out_path.with_suffix(".popef")
        exe = Compiler.compile(out.SerializeToString(), [o.name for o in out.graph.output], opts)
        exe.save(str(popef))
        print(f"poprt: wrote {popef}")
        print(f"poprt: {exe.prediction.summary(exe.target['ipu_version'])}")
    return 0


def main(argv=None) -> int:
    """Entry point of the ``poprt`` console script; returns the exit status."""
    args = _build_parser().parse_args(argv)
    try:
        return run(args)
    except SystemExit:
        raise
    except _CliError as e:
        sys.stderr.write(f"poprt: error: {e}\n")
        return 2
    except Exception as e:  # noqa: BLE001 - every failure of the job: one line, non-zero exit
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.stderr.write(f"poprt: error: {msg}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
