"""``poprand``: random number generation (PopLibs ``include/poprand/RandomGen.hpp``).

Every generator creates a tensor shaped and mapped like ``reference`` and fills it from one
``torch.Generator`` seeded from ``(seed[0], seed[1], seedModifier)``: the same seed and modifier
give the same numbers, across runs and whatever the tile mapping (numbers are drawn in the
reference's flattened element order). The same seed and modifier also give the *same bit
stream* to every function, so ``dropout`` and ``bernoulli`` with equal ``keepProbability``/``prob``
draw the same mask (PopART relies on this to regenerate a dropout mask in the backward pass).
The bit stream differs from the IPU hardware's PRNG: only the distributions match.

``seed`` is a device tensor of 2 ``UNSIGNED_INT`` (each replica reads its own copy), or ``None``:
then the generator uses the graph's hardware seed state, a hidden ``[2]`` UNSIGNED_INT variable
(``hwSeeds``, initial value ``0xAA99330F, 0xCC55E1B4``) that every unseeded call advances, as the
tiles' PRNG state advances on hardware; :func:`setSeed` sets it.

Cycle estimates per tile (MultiVertex), from PopLibs ``lib/poprand/poprandCycleEstimators.cpp``
(``vw`` = dataPathWidth / 32 for float, / 16 for half):

- ``UniformSupervisor``: ``4 + 4 ceil(n/vw') + 22|24 x 6 + [n % vw'] x 4|12`` (vw' = 64/2 | 64/4 as
  PopLibs writes it); int: ``4 + 22 x 6 + 6 (n // 2) + 2 (n % 2)``;
- ``NormalSupervisor``: ``4 + 4 ceil(n/vw) + 22|24 x 6 + [n % vw] x 3|12``;
- ``TruncatedNormalSupervisor``: ``4 + 26|28 x 6 + (11|12 it + 5) ceil(n/vw) + [n % vw](13|12 it + 2|10)``;
- ``BernoulliSupervisor``: ``4 + ceil(n/vw') + 23|21 x 6 + rem``; ``DropoutSupervisor``:
  ``6 + 24 x 6 + 2 ceil(n/vw) + [n % vw] x 1|9``; ``SetSeedSupervisor``: ``14 + 27 x 6``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import output_like, read_on_tiles, tile_counts_of

__all__ = ["uniform", "logUniform", "normal", "truncatedNormal", "bernoulli", "dropout", "shapedDropout",
           "setSeed", "hardware_seed", "DEFAULT_HW_SEED"]

#: Initial value of the hidden hardware seed state (the 64-bit default seed of PopLibs' old
#: ``poprand::Random``, split into two words).
DEFAULT_HW_SEED = (0xAA99330F, 0xCC55E1B4)
_MASK64 = (1 << 64) - 1
#: TruncatedNormal resampling iterations PopLibs' vertex runs (``RandomGen.cpp``); openipu samples
#: the truncated distribution exactly (inverse CDF), the constant only feeds the estimate. [A]
TRUNCATED_NORMAL_ITERATIONS = 4


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _generators(seed_rows: torch.Tensor, modifier: int) -> list[torch.Generator]:
    """One generator per replica from its ``[2]`` seed words and the modifier."""
    out = []
    for s0, s1 in seed_rows.to(torch.int64).tolist():
        x = _splitmix(((s0 & 0xFFFFFFFF) << 32) | (s1 & 0xFFFFFFFF))
        x = _splitmix(x ^ (modifier & 0xFFFFFFFF))
        g = torch.Generator()
        g.manual_seed(x & ((1 << 63) - 1))
        out.append(g)
    return out


def hardware_seed(graph):
    """The graph's hidden hardware seed state: ``UNSIGNED_INT [2]`` on tile 0 (created on first use)."""
    st = graph._state
    hw = getattr(st, "poprand_hw_seed", None)
    if hw is None:
        hw = graph.getTopLevelGraph().addVariable(poplar.UNSIGNED_INT, [2], "poprand/hwSeeds")
        graph.getTopLevelGraph().setTileMapping(hw, 0)
        graph.getTopLevelGraph().setInitialValue(hw, np.array(DEFAULT_HW_SEED, np.uint32))
        st.poprand_hw_seed = hw
    return hw


def _advance(seed_rows: torch.Tensor) -> torch.Tensor:
    rows = []
    for s0, s1 in seed_rows.to(torch.int64).tolist():
        x = _splitmix((((s0 & 0xFFFFFFFF) << 32) | (s1 & 0xFFFFFFFF)) ^ 0x5DEECE66D)
        rows.append([x >> 32, x & 0xFFFFFFFF])
    return torch.tensor(rows, dtype=torch.int64)


def _draw(kind: str, params: tuple, n: int, g: torch.Generator, out_dtype) -> torch.Tensor:
    """``n`` numbers of the distribution ``kind`` from generator ``g`` (float64 math, then cast)."""
    if kind == "uniform_int":
        lo, hi = params
        return torch.randint(int(lo), int(hi) + 1, (n,), generator=g, dtype=torch.int64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    if kind == "uniform":
        lo, hi = params
        return lo + (hi - lo) * u
    if kind == "log_uniform":
        lo, hi, base = params
        lb = math.log(base)
        return torch.exp((math.log(lo) / lb + (math.log(hi) / lb - math.log(lo) / lb) * u) * lb)
    if kind == "bernoulli":
        (p,) = params
        return (u < p).to(torch.float64)
    if kind == "normal":
        mean, std = params
        return mean + std * math.sqrt(2.0) * torch.erfinv(2 * _open(u) - 1)
    if kind == "truncated_normal":
        mean, std, alpha = params
        lo = 0.5 * (1 + math.erf(-alpha / math.sqrt(2)))
        v = lo + (1 - 2 * lo) * _open(u)
        return mean + std * math.sqrt(2.0) * torch.erfinv(2 * v - 1)
    raise AssertionError(kind)


def _open(u):
    """Map [0, 1) to the open interval (0, 1) so the inverse CDF stays finite."""
    return u * (1 - 2 ** -40) + 2 ** -41


@kernel
def _gen_kernel(kind, params, seed, modifier, out, advance, ctx):
    R = ctx.replicas
    rows = ctx.read(seed).reshape(R, 2)
    n = out.numElements()
    vals = torch.stack([_draw(kind, params, n, g, None) for g in _generators(rows, modifier)])
    if out.elementType().is_float:
        vals = vals.to(torch.float32)
    ctx.write(out, vals)
    if advance:
        ctx.write(seed, _advance(rows))


@kernel
def _dropout_kernel(seed, modifier, src, out, keep, scale, shaped_shape, advance, ctx):
    R = ctx.replicas
    rows = ctx.read(seed).reshape(R, 2)
    x = ctx.read(src)
    n = int(np.prod(shaped_shape)) if shaped_shape is not None else out.numElements()
    mask = torch.stack([_draw("bernoulli", (keep,), n, g, None) for g in _generators(rows, modifier)])
    if shaped_shape is not None:
        mask = mask.reshape(R, *([1] * (x.dim() - 1 - len(shaped_shape))), *shaped_shape)
    else:
        mask = mask.reshape(x.shape)
    if x.is_floating_point():
        ctx.write(out, x * (mask.to(x.dtype) * torch.tensor(scale, dtype=x.dtype)))
    else:
        ctx.write(out, x * mask.to(x.dtype))
    if advance:
        ctx.write(seed, _advance(rows))


def _seed_tensor(graph, seed, what):
    if seed is None:
        return hardware_seed(graph), True
    if not isinstance(seed, poplar.Tensor):
        raise poplar.graph_connection_error(f"{what}: seed must be a Tensor of 2 UNSIGNED_INT or None")
    if seed.numElements() != 2 or seed.elementType() not in (poplar.UNSIGNED_INT, poplar.INT):
        raise poplar.graph_connection_error(
            f"{what}: seed must hold 2 UNSIGNED_INT elements, got {seed.elementType()} {seed.shape()}")
    if not graph.is_mapped(seed):
        raise poplar.invalid_tile_mapping(f"{what}: the seed tensor is not mapped to a tile")
    return seed, False


def _cycles(vertex: str, n: np.ndarray, type_, target) -> np.ndarray:
    w = target.getNumWorkerContexts()
    dpw = target.getDataPathWidth()
    is_float = type_ == poplar.FLOAT
    n = np.asarray(n, np.int64)
    if vertex == "UniformSupervisor":
        if not type_.is_float:
            return 4 + 22 * w + 6 * (n // 2) + (n % 2) * 2
        vw = dpw // (2 if is_float else 4)
        return 4 + 4 * (-(-n // vw)) + (22 if is_float else 24) * w + (n % vw != 0) * (4 if is_float else 12)
    if vertex == "BernoulliSupervisor":
        vw = dpw // (4 if type_ == poplar.HALF else 2)
        return 4 + (-(-n // vw)) + (21 if type_ == poplar.HALF else 23) * w + (n % vw != 0) * (9 if type_ == poplar.HALF else 1)
    vw = dpw // (32 if is_float else 16)
    if vertex == "NormalSupervisor":
        return 4 + 4 * (-(-n // vw)) + (22 if is_float else 24) * w + (n % vw != 0) * (3 if is_float else 12)
    if vertex == "TruncatedNormalSupervisor":
        it = TRUNCATED_NORMAL_ITERATIONS
        if is_float:
            return 4 + 26 * w + (11 * it + 5) * (-(-n // vw)) + (n % vw != 0) * (13 * it + 2)
        return 4 + 28 * w + (12 * it + 5) * (-(-n // vw)) + (n % vw != 0) * (12 * it + 10)
    if vertex == "DropoutSupervisor":
        return 6 + 24 * w + 2 * (-(-n // vw)) + (n % vw != 0) * (1 if is_float else 9)
    raise AssertionError(vertex)


def _generate(graph, seed, seed_modifier, reference, out_type, prog, name, kind, params, vertex, allowed):
    out_type = poplar.types.as_type(out_type)
    if out_type not in allowed:
        raise poplar.graph_connection_error(
            f"{name}: output type {out_type} is not supported; use one of {', '.join(map(str, allowed))}")
    seed_t, advance = _seed_tensor(graph, seed, name)
    if not graph.is_mapped(reference):
        raise poplar.invalid_tile_mapping(f"{name}: reference tensor {reference.shortString()} is not completely mapped")
    out = output_like(graph, out_type, reference.shape(), (reference,), f"{name}/out")   # mapped like reference
    used, counts = tile_counts_of(graph, out)
    cs = graph.addComputeSet(name)
    writes = [Access(out)] + ([Access(seed_t)] if advance else [])
    graph.add_vertex_group(cs, VertexGroup(
        f"poprand::{vertex}<{out_type}>", used, _cycles(vertex, counts, out_type, graph.getTarget()),
        functools.partial(_gen_kernel, kind, params, seed_t, int(seed_modifier) & 0xFFFFFFFF, out, advance),
        reads=[Access(seed_t.flatten(), read_on_tiles(seed_t.flatten(), used))],   # every tile reads the seed
        writes=writes, multi=True, flops=float(out.numElements()), state_bytes=16))
    prog.add(poplar.program.Execute(cs, name))
    return out


_FLOATS = (poplar.FLOAT, poplar.HALF)


def uniform(graph, seed, seedModifier, reference, outType, minVal, maxVal, prog, debug_name: str = ""):  # noqa: N803
    """Uniform numbers in ``[minVal, maxVal)`` shaped and mapped like ``reference``
    (``poprand::uniform``). ``outType``: FLOAT, HALF or INT (INT: integers in ``[minVal, maxVal]``).

    Raises:
        poplar.graph_connection_error: a bad seed or output type, or ``maxVal < minVal``.
    """
    if maxVal < minVal:
        raise poplar.graph_connection_error(f"uniform: maxVal ({maxVal}) must be >= minVal ({minVal})")
    kind = "uniform" if poplar.types.as_type(outType).is_float else "uniform_int"
    return _generate(graph, seed, seedModifier, reference, outType, prog, debug_name or "uniform", kind,
                     (float(minVal), float(maxVal)), "UniformSupervisor", (*_FLOATS, poplar.INT))


def logUniform(graph, seed, seedModifier, reference, outType, minVal, maxVal, prog, base: float = math.e,  # noqa: N802,N803
               debug_name: str = ""):
    """``base ** U(log_base minVal, log_base maxVal)``, for ``0 < minVal <= maxVal`` (``poprand::logUniform``);
    FLOAT or HALF."""
    if not 0 < minVal <= maxVal:
        raise poplar.graph_connection_error(f"logUniform: need 0 < minVal <= maxVal, got {minVal}, {maxVal}")
    return _generate(graph, seed, seedModifier, reference, outType, prog, debug_name or "logUniform", "log_uniform",
                     (float(minVal), float(maxVal), float(base)), "UniformSupervisor", _FLOATS)


def normal(graph, seed, seedModifier, reference, outType, mean, stdDev, prog, debug_name: str = ""):  # noqa: N803
    """Normal numbers with ``mean`` and ``stdDev`` (``poprand::normal``); FLOAT or HALF."""
    return _generate(graph, seed, seedModifier, reference, outType, prog, debug_name or "normal", "normal",
                     (float(mean), float(stdDev)), "NormalSupervisor", _FLOATS)


def truncatedNormal(graph, seed, seedModifier, reference, outType, mean, stdDev, alpha, prog,  # noqa: N802,N803
                    debug_name: str = ""):
    """Normal numbers truncated to ``mean ± alpha * stdDev`` (``poprand::truncatedNormal``);
    FLOAT or HALF. Sampled exactly by inverse CDF (PopLibs resamples a fixed number of times)."""
    if alpha <= 0:
        raise poplar.graph_connection_error(f"truncatedNormal: alpha must be positive, got {alpha}")
    return _generate(graph, seed, seedModifier, reference, outType, prog, debug_name or "truncatedNormal",
                     "truncated_normal", (float(mean), float(stdDev), float(alpha)), "TruncatedNormalSupervisor",
                     _FLOATS)


def bernoulli(graph, seed, seedModifier, reference, outType, prob, prog, debug_name: str = ""):  # noqa: N803
    """1 with probability ``prob``, else 0 (``poprand::bernoulli``); FLOAT, HALF or INT."""
    if not 0 <= prob <= 1:
        raise poplar.graph_connection_error(f"bernoulli: prob must be in [0, 1], got {prob}")
    return _generate(graph, seed, seedModifier, reference, outType, prog, debug_name or "bernoulli", "bernoulli",
                     (float(prob),), "BernoulliSupervisor", (*_FLOATS, poplar.INT))


def _dropout(graph, seed, seed_modifier, x, reference, keep, scale, prog, name, shaped):
    if not 0 < keep <= 1:
        raise poplar.graph_connection_error(f"{name}: keepProbability must be in (0, 1], got {keep}")
    if x.elementType() not in _FLOATS:
        raise poplar.graph_connection_error(f"{name}: input must be FLOAT or HALF, got {x.elementType()}")
    if not shaped and list(reference.shape()) != list(x.shape()):
        raise poplar.index_error(f"{name}: reference shape {reference.shape()} must equal the input's {x.shape()}")
    if shaped:
        try:
            np.broadcast_shapes(tuple(reference.shape()), tuple(x.shape()))
        except ValueError:
            raise poplar.index_error(f"{name}: reference shape {reference.shape()} cannot broadcast to the input's "
                                     f"{x.shape()}") from None
    seed_t, advance = _seed_tensor(graph, seed, name)
    ref = x if shaped else reference
    if not graph.is_mapped(ref):
        raise poplar.invalid_tile_mapping(f"{name}: tensor {ref.shortString()} is not completely mapped")
    out = output_like(graph, x.elementType(), x.shape(), (reference, x) if not shaped else (x,), f"{name}/out")
    used, counts = tile_counts_of(graph, out)
    cs = graph.addComputeSet(name)
    writes = [Access(out)] + ([Access(seed_t)] if advance else [])
    graph.add_vertex_group(cs, VertexGroup(
        f"poprand::DropoutSupervisor<{x.elementType()}>", used,
        _cycles("DropoutSupervisor", counts, x.elementType(), graph.getTarget()),
        functools.partial(_dropout_kernel, seed_t, int(seed_modifier) & 0xFFFFFFFF, x, out, float(keep), float(scale),
                          tuple(reference.shape()) if shaped else None, advance),
        reads=[Access(x, out), Access(seed_t.flatten(), read_on_tiles(seed_t.flatten(), used))],
        writes=writes, multi=True, flops=float(2 * x.numElements()), state_bytes=24))
    prog.add(poplar.program.Execute(cs, name))
    return out


def dropout(graph, seed, seedModifier, input, reference, keepProbability, scale, prog,  # noqa: N803,A002
            debug_name: str = ""):
    """``input * mask * scale`` with ``mask`` ~ Bernoulli(``keepProbability``) (``poprand::dropout``).

    ``reference`` has ``input``'s shape; the mask equals ``bernoulli(seed, seedModifier, reference,
    ..., keepProbability)``. Returns a new tensor mapped like ``reference``.

    Raises:
        poplar.graph_connection_error: bad probability, type or seed.
        poplar.index_error: ``reference`` and ``input`` shapes differ.
    """
    return _dropout(graph, seed, seedModifier, input, reference, keepProbability, scale, prog,
                    debug_name or "dropout", False)


def shapedDropout(graph, seed, seedModifier, input, reference, keepProbability, scale, prog,  # noqa: N802,N803,A002
                  debug_name: str = ""):
    """Dropout whose mask has ``reference``'s shape, broadcast over ``input`` (``poprand::shapedDropout``)."""
    return _dropout(graph, seed, seedModifier, input, reference, keepProbability, scale, prog,
                    debug_name or "shapedDropout", True)


@kernel
def _set_seed_kernel(master, modifier, hw, ctx):
    rows = ctx.read(master).reshape(ctx.replicas, 2).to(torch.int64)
    out = []
    for s0, s1 in rows.tolist():
        x = _splitmix(((s0 & 0xFFFFFFFF) << 32 | (s1 & 0xFFFFFFFF)) ^ (modifier << 7))
        out.append([x >> 32, x & 0xFFFFFFFF])
    ctx.write(hw, torch.tensor(out, dtype=torch.int64))


def setSeed(graph, masterSeed, seedModifier, prog, debug_name: str = "") -> None:  # noqa: N802,N803
    """Set the hardware seed state from ``masterSeed`` (2 UNSIGNED_INT) and ``seedModifier``
    (``poprand::setSeed``): later unseeded calls are then reproducible. One ``SetSeedSupervisor``
    per tile (``14 + 27 x 6`` cycles)."""
    seed_t, _ = _seed_tensor(graph, masterSeed, "setSeed")
    hw = hardware_seed(graph)
    T = graph.getTarget().getNumTiles()
    tiles = graph._tiles[np.arange(T)]
    cs = graph.addComputeSet(debug_name or "setSeed")
    graph.add_vertex_group(cs, VertexGroup(
        "poprand::SetSeedSupervisor", tiles, np.full(T, 14 + 27 * graph.getTarget().getNumWorkerContexts()),
        functools.partial(_set_seed_kernel, seed_t, int(seedModifier) & 0xFFFFFFFF, hw),
        reads=[Access(seed_t.flatten(), read_on_tiles(seed_t.flatten(), tiles))],   # every tile reads the seed
        writes=[Access(hw)], multi=True, flops=0.0, state_bytes=8))
    prog.add(poplar.program.Execute(cs, debug_name or "setSeed"))
