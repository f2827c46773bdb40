#!/usr/bin/env python
"""Pass rates of the ONNX backend tests: at kernel level (default), or through PopART sessions.

    PYTHONPATH=src python scripts/onnx_node_tests.py [--failures] [--kind node|simple|...] [-k SUBSTR]
    PYTHONPATH=src python scripts/onnx_node_tests.py --backend [--failures] [-k SUBSTR]

Kernel level prints "N of M node tests pass at kernel level" (single-node test cases run straight
through their kernel) and, for the other kinds, how many run through ``run_model_on_host``.
``--backend`` runs ``onnx.backend.test.BackendTest`` with ``openipu.onnx_backend.OpenIPUBackend``
(every test through a PopART ``InferenceSession``, as ``tests/test_onnx_backend.py`` does) and
prints "N of M node tests pass through PopART" and the counts of the model-test kinds;
``--write-backend-expected FILE`` writes its failures as the backend's expected-failures list.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def node_cases(single: bool = True):
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [c for c in cases if (len(c.model.graph.node) == 1) == single]


def model_cases(kind: str):
    from onnx.backend.test.loader import load_model_tests
    return [c for c in load_model_tests(kind=kind) if c.model_dir is not None]


def run(cases):
    from openipu.popart.onnx_ops._reference import check_backend_case
    failures = {}
    for c in cases:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_backend_case(c)
        except Exception as e:  # noqa: BLE001 - report every kind of failure
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")
            failures[c.name] = msg[:200]
    return failures


def reason(name: str, msg: str) -> str:
    """A short, honest reason for a failure, from the error it raised."""
    import re
    m = re.search(r"no host kernel for (\S+)", msg)
    if m:
        return f"no host kernel for {m.group(1)}"
    if re.search(r"\b(u?int[24]|float4\w*)\b|INT[24]|FLOAT4", msg + name):
        return "sub-byte element type (int4/uint4/int2/uint2/float4) has no torch dtype"
    if "object" in msg or "string" in msg.lower():
        return "string tensors have no torch dtype"
    if "bernoulli" in name or "dropout" in name:
        return "random values come from torch's generator, not numpy's"
    if "fp16" in name and "Not equal" in msg:
        return "fp16 rounding of intermediates differs from the reference by 1-2 ulps (over rtol 1e-3)"
    return "TODO " + msg[:80]


BACKEND_KINDS = {"OnnxBackendNodeModelTest": "node", "OnnxBackendSimpleModelTest": "simple",
                 "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
                 "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator"}


def backend_run(k: str = ""):
    """``{kind: {test name: error or None}}`` of the BackendTest cases through OpenIPUBackend."""
    import logging
    import re
    import unittest

    import onnx.backend.test
    from openipu.onnx_backend import OpenIPUBackend
    logging.disable(logging.WARNING)
    bt = onnx.backend.test.BackendTest(OpenIPUBackend, "onnx_node_tests")
    out: dict[str, dict[str, str | None]] = {}
    for cname, cls in bt.test_cases.items():
        kind = BACKEND_KINDS.get(cname)
        if kind is None:
            continue
        for name in sorted(dir(cls)):
            if not (name.startswith("test_") and name.endswith("_cpu")) or k not in name:
                continue
            res = unittest.TestResult()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls(name).run(res)
            errs = res.failures + res.errors
            msg = None
            if errs:
                lines = [x for x in errs[0][1].strip().splitlines() if x.strip()]
                msg = lines[-1]
                for i, line in enumerate(lines):
                    if re.match(r"^[\w.]*(Error|Exception|exception)\b", line):
                        msg = " ".join(x.strip() for x in lines[i:i + 4])
                        break
            out.setdefault(kind, {})[name[:-4]] = msg
    return out


def backend_reason(name: str, msg: str, kernel_reasons: dict) -> str:
    """A short, honest reason for a failure through PopART, from the error it raised."""
    if "sequence or optional" in msg or "'list' object" in msg or name.startswith(
            ("test_sequence_", "test_split_to_sequence", "test_optional_")):
        return "sequence/optional values: PopART has only tensor inputs, outputs and ops"
    if "depends on the values of its inputs" in msg:
        return "output shape depends on input values (static graphs only)"
    if name.startswith("test_bitcast") and "float64" in name:
        return "BitCast of DOUBLE: the backend holds doubles as float32, so their bits are not kept"
    if name.startswith("test_operator_add"):
        return ("reference data are uninitialised float64 memory (denormals ~1e-309, values ~1e+198): "
                "float32 flushes them to 0 or overflows")
    if name in kernel_reasons:
        return kernel_reasons[name]
    if "STRING" in msg or "string" in name:
        return "string tensors have no IPU type"
    return "TODO " + msg[:100]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--failures", action="store_true", help="list failing tests and errors")
    ap.add_argument("--kind", action="append",
                    help="node, node-multi, simple, pytorch-converted, pytorch-operator")
    ap.add_argument("-k", default="", help="only tests whose name contains this")
    ap.add_argument("--write-expected", metavar="FILE",
                    help="write the failures as an expected-failures list with reasons")
    ap.add_argument("--backend", action="store_true",
                    help="run the tests through PopART sessions (openipu.onnx_backend)")
    ap.add_argument("--write-backend-expected", metavar="FILE",
                    help="with --backend: write the failures as the backend expected-failures list")
    args = ap.parse_args()
    if args.backend:
        t = time.time()
        res = backend_run(args.k)
        for kind, tests in res.items():
            fails = {n: m for n, m in tests.items() if m is not None}
            label = "node tests pass through PopART" if kind == "node" else \
                f"{kind} model tests pass through PopART"
            print(f"{len(tests) - len(fails)} of {len(tests)} {label}")
            if args.failures:
                for name, msg in sorted(fails.items()):
                    print(f"  {name}  # {msg[:200]}")
        print(f"({time.time() - t:.1f} s)")
        if args.write_backend_expected:
            here = os.path.dirname(os.path.abspath(__file__))
            kernel = {}
            with open(os.path.join(here, "..", "tests", "onnx_backend_expected_failures.txt")) as f:
                for line in f:
                    name, _, why = line.partition("#")
                    if name.strip():
                        kernel[name.strip()] = why.strip()
            with open(args.write_backend_expected, "w") as f:
                f.write("# ONNX backend tests that fail through PopART sessions (tests/test_onnx_backend.py,\n"
                        "# openipu.onnx_backend.OpenIPUBackend). One line per test: name  # reason. A listed\n"
                        "# test that passes fails the suite (\"unexpectedly passed\") until it is removed here.\n"
                        "# Kernel-level failures (tests/test_onnx_ops.py) are listed separately in\n"
                        "# onnx_backend_expected_failures.txt.\n")
                for tests in res.values():
                    for name, msg in sorted(tests.items()):
                        if msg is not None:
                            f.write(f"{name}  # {backend_reason(name, msg, kernel)}\n")
        return 0
    collected = {}
    kinds = args.kind or ["node", "node-multi", "simple", "pytorch-converted", "pytorch-operator"]
    for kind in kinds:
        t = time.time()
        if kind == "node":
            cases, label = node_cases(True), "node tests pass at kernel level"
        elif kind == "node-multi":
            cases, label = node_cases(False), "multi-node node tests pass on the host executor"
        else:
            cases, label = model_cases(kind), f"{kind} model tests pass on the host executor"
        cases = [c for c in cases if args.k in c.name]
        fails = run(cases)
        collected.update(fails)
        print(f"{len(cases) - len(fails)} of {len(cases)} {label} ({time.time() - t:.1f} s)")
        if args.failures:
            for name, msg in sorted(fails.items()):
                print(f"  {name}  # {msg}")
    if args.write_expected:
        with open(args.write_expected, "w") as f:
            f.write("# ONNX backend tests that fail on the host kernels (tests/test_onnx_ops.py).\n"
                    "# One line per test: name  # reason. A listed test that passes fails the\n"
                    "# suite until it is removed here.\n")
            for name, msg in sorted(collected.items()):
                f.write(f"{name}  # {reason(name, msg)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
