"""``popart.initializePoplarDebugInfo(filename, format="json")`` and
``popart.closePoplarDebugInfo()``: Poplar's debug-information streamer
(``poplar::DebugInfo::initializeStreamer`` / ``closeStreamer``), which PopART's Python module
exposes so that a script can write the debug contexts of what it compiles to a file for the
PopVision Graph Analyser.

While a streamer is open, every PopART session made records one debug context per IR op
(``layer`` ``"popart"``, ``category`` ``"op"``: the op's name, ``opid`` ``domain.Type:opset``,
input and output tensor ids, virtual graph and pipeline stage when set, and whether it belongs to
the backward pass); ``closePoplarDebugInfo`` writes ``{"contexts": [...]}`` to the file, as JSON
(``format="json"``, the default and what any other format string gives, as in PopART) or CBOR
(``format="cbor"``, RFC 8949, what the Graph Analyser reads as ``debug.cbor``). openipu's layout
of a context follows Poplar's field names; its ids are openipu's own. Closing with no streamer
open does nothing; opening a second one first writes the open one.
"""

from __future__ import annotations

import json
import struct

_state: dict = {}


def initializePoplarDebugInfo(filename: str, format: str = "json") -> None:  # noqa: A002,N802
    """Start recording debug contexts for ``filename`` (``format``: ``"json"`` or ``"cbor"``)."""
    if _state:
        closePoplarDebugInfo()
    _state.update(filename=str(filename), format="cbor" if format == "cbor" else "json", contexts=[])


def closePoplarDebugInfo() -> None:  # noqa: N802
    """Write the recorded contexts to the file and stop recording."""
    if not _state:
        return
    doc = {"contexts": _state["contexts"]}
    fmt, fn = _state["format"], _state["filename"]
    _state.clear()
    if fmt == "cbor":
        with open(fn, "wb") as f:
            f.write(cbor_dumps(doc))
    else:
        with open(fn, "w") as f:
            json.dump(doc, f, indent=1)


def active() -> bool:
    return bool(_state)


def record_ir(ir, session_kind: str) -> None:
    """Add the debug contexts of ``ir``'s ops (a session of kind ``session_kind``), when a
    streamer is open."""
    if not _state:
        return
    contexts = _state["contexts"]
    parent = len(contexts)
    contexts.append({"id": parent, "name": session_kind, "layer": "popart", "category": "session"})
    for op in ir.ops:
        c = {"id": len(contexts), "parentId": parent, "name": op.name or op.op_type, "layer": "popart",
             "category": "op", "opid": f"{op.domain or 'ai.onnx'}.{op.op_type}:{op.opset}",
             "inputs": [x for x in op.inputs if x], "outputs": [x for x in op.outputs if x],
             "pass": "backward" if op.grad_of is not None else "forward"}
        if op.vgraph is not None:
            c["virtualGraphId"] = int(op.vgraph)
        if op.pipeline_stage is not None:
            c["pipelineStage"] = int(op.pipeline_stage)
        contexts.append(c)


def cbor_dumps(value) -> bytes:
    """``value`` (dict with str keys, list, str, int, float, bool, None) as CBOR (RFC 8949)."""
    out = bytearray()
    _cbor(value, out)
    return bytes(out)


def _head(major: int, n: int, out: bytearray) -> None:
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += bytes([major << 5 | 24, n])
    elif n < 1 << 16:
        out += bytes([major << 5 | 25]) + n.to_bytes(2, "big")
    elif n < 1 << 32:
        out += bytes([major << 5 | 26]) + n.to_bytes(4, "big")
    else:
        out += bytes([major << 5 | 27]) + n.to_bytes(8, "big")


def _cbor(v, out: bytearray) -> None:
    if v is None:
        out.append(0xF6)
    elif v is True or v is False:
        out.append(0xF5 if v else 0xF4)
    elif isinstance(v, int):
        _head(0, v, out) if v >= 0 else _head(1, -1 - v, out)
    elif isinstance(v, float):
        out += b"\xfb" + struct.pack(">d", v)
    elif isinstance(v, str):
        b = v.encode()
        _head(3, len(b), out)
        out += b
    elif isinstance(v, (list, tuple)):
        _head(4, len(v), out)
        for x in v:
            _cbor(x, out)
    elif isinstance(v, dict):
        _head(5, len(v), out)
        for k, x in v.items():
            _cbor(str(k), out)
            _cbor(x, out)
    else:
        raise TypeError(f"cbor_dumps: cannot encode {type(v).__name__}")
