"""``poprt.passes.pattern_helper``: find chains of ops in an ONNX graph by a small pattern text.

A pattern is a list of strings. Each string is a chain of ``OpType:key`` tokens joined by ``->``
(``"s:0->Reshape:r->MatMul:m->e:1"``): ``A->B`` means node ``B`` reads an output of node ``A``.
``s:<n>`` and ``e:<n>`` mark the chain's open start and end (any producer, any consumer) and
match nothing themselves. Whitespace is free. A key used in several strings is the same node,
so extra strings add branches (``"Reshape:r->Mul:x"`` beside ``"Reshape:r->Squeeze:q->Mul:x"``).
Keys may be any text, digits included (``"Reshape:1"`` gives ``ops["1"]``).

``PatternMatcher(patterns).next_pattern(graph)`` returns the first match not returned before, as
``{key: Match}`` with ``Match.node`` (the ``NodeProto``) and ``Match.index`` (its position in
``graph.node``), or ``None`` when there is none; callers edit the graph and call it again to
iterate.

Source: the uses in Byte MLPerf's ``deberta_pack`` pass (PopRT's own implementation is not
public; the ``s:``/``e:`` numbers' meaning is not documented and they are ignored here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx


@dataclass
class Match:
    """One matched node: ``node`` (``onnx.NodeProto``) and ``index`` (its position in ``graph.node``)."""

    node: onnx.NodeProto
    index: int


_MARK = re.compile(r"^[se]:\s*\d*$")


class PatternMatcher:
    """Match a pattern (list of chain strings, see the module docstring) in a graph.

    Raises:
        ValueError: a token that is not ``OpType:key`` nor an ``s:``/``e:`` marker, or a key used
            with two op types.
    """

    def __init__(self, patterns):
        if isinstance(patterns, str):
            patterns = [patterns]
        self.ops: dict[str, str] = {}          # key -> op type, in order of first use
        self.edges: set[tuple[str, str]] = set()
        for text in patterns:
            prev = None
            for tok in (t.strip() for t in str(text).split("->")):
                if not tok:
                    continue
                if _MARK.match(tok):
                    prev = None
                    continue
                op, sep, key = tok.partition(":")
                op, key = op.strip(), key.strip()
                if not sep or not op or not key:
                    raise ValueError(f"Pattern token '{tok}' is not 'OpType:key' (nor s:N / e:N)")
                if self.ops.setdefault(key, op) != op:
                    raise ValueError(f"Pattern key '{key}' is used as {self.ops[key]} and as {op}")
                if prev is not None:
                    self.edges.add((prev, key))
                prev = key
        if not self.ops:
            raise ValueError("The pattern names no ops")
        self._seen: set = set()

    def _search(self, graph: onnx.GraphProto):
        nodes = list(graph.node)
        by_type: dict[str, list[int]] = {}
        for i, n in enumerate(nodes):
            by_type.setdefault(n.op_type, []).append(i)
        keys = list(self.ops)
        outs = [set(o for o in n.output if o) for n in nodes]

        def ok(assign, key, i):
            for a, b in self.edges:
                if a == key and b in assign and not (outs[i] & set(nodes[assign[b]].input)):
                    return False
                if b == key and a in assign and not (outs[assign[a]] & set(nodes[i].input)):
                    return False
            return True

        def rec(assign, k):
            if k == len(keys):
                yield dict(assign)
                return
            key = keys[k]
            used = set(assign.values())
            for i in by_type.get(self.ops[key], []):
                if i in used or not ok(assign, key, i):
                    continue
                assign[key] = i
                yield from rec(assign, k + 1)
                del assign[key]

        for found in rec({}, 0):
            yield {k: Match(nodes[i], i) for k, i in found.items()}

    @staticmethod
    def _sig(match: dict) -> tuple:
        return tuple(sorted((k, m.node.op_type, m.node.name, tuple(m.node.output)) for k, m in match.items()))

    def next_pattern(self, graph: onnx.GraphProto):
        """The next match in ``graph`` (``{key: Match}``), or None when no new match is left."""
        for m in self._search(graph):
            sig = self._sig(m)
            if sig not in self._seen:
                self._seen.add(sig)
                return m
        return None


__all__ = ["Match", "PatternMatcher"]
