"""The inputs of a model run (``openipu run``, :func:`openipu.runner.run_model`, ``openipu sweep``):
the model's graph inputs, batch size and fixed shapes, ``.npz`` input files read without pickle
(each array's size checked against host memory from its header before numpy allocates it),
random inputs of the right types and shapes, and the checks an input array passes."""

from __future__ import annotations

import numpy as np
import onnx

from openipu.popart.model_check import host_bytes_available


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def gib(b: float) -> str:
    """``b`` bytes as GiB with one decimal, for messages."""
    return f"{b / (1 << 30):,.1f} GiB"


_NP_OF_ONNX = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
               onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
               onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.UINT8: np.uint8,
               onnx.TensorProto.INT8: np.int8, onnx.TensorProto.INT16: np.int16,
               onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.UINT32: np.uint32}


#: numpy kinds an input array may have: bool, signed / unsigned integers, floats
_FEEDABLE_KINDS = "biuf"



def check_input_array(name: str, arr) -> np.ndarray:
    """``arr`` as an ndarray an IPU input can take: bool, integer or float. Raises
    ``ValueError`` (one line naming the input) for complex values (the IPU has no complex
    type), object, string, structured or date arrays."""
    arr = np.asarray(arr) if not isinstance(arr, np.ndarray) else arr
    if arr.dtype.kind == "c":
        raise ValueError(f"input '{name}' is complex ({arr.dtype}); the IPU has no complex type: give the real "
                         "and imaginary parts as separate real inputs")
    if arr.dtype.kind not in _FEEDABLE_KINDS:
        raise ValueError(f"input '{name}' has dtype {arr.dtype}, which is not a number type (bool, integer or "
                         "float)")
    return arr


def load_inputs(path: str) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``path``, keyed by name, read without pickle.

    Raises ``ValueError`` (one line) when the file is missing, not an ``.npz`` (a single
    ``.npy`` array included), truncated or corrupt, holds no arrays, or holds an array that
    :func:`check_input_array` refuses (object arrays cannot be read without pickle)."""
    import zipfile
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except FileNotFoundError:
        raise ValueError(f"--input file '{path}' does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"--input '{path}' is a directory, not an .npz file") from None
    except OSError as e:
        raise ValueError(f"--input file '{path}' cannot be read ({e.strerror or e})") from None
    if not magic.startswith(b"PK") and not magic.startswith(b"\x93NUMPY"):
        raise ValueError(f"--input file '{path}' is not an .npz file (an .npz is a zip of arrays, as numpy.savez "
                         "writes)")
    try:
        f = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ValueError(f"--input file '{path}' does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"--input '{path}' is a directory, not an .npz file") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"--input file '{path}' is not a readable .npz file ({first_line(e)})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"--input file '{path}' holds a single array (.npy), not an .npz of arrays keyed by input "
                         "name: write it with numpy.savez(path, name=array, ...)")
    out = {}
    with f:
        try:
            for k in f.files:
                _check_npz_member_size(path, f, k)
                out[k] = check_input_array(k, f[k])
        except ValueError as e:
            if "pickle" in str(e):
                raise ValueError(f"--input file '{path}': array '{k}' holds Python objects, which openipu does not "
                                 "read (no pickle); store numbers") from None
            if str(e).startswith(("input '", "--input file")):
                raise
            raise ValueError(f"--input file '{path}' is not a readable .npz file (array '{k}': "
                             f"{first_line(e)})") from None
        except (OSError, EOFError, zipfile.BadZipFile, KeyError, RuntimeError) as e:
            raise ValueError(f"--input file '{path}' is truncated or corrupt (array '{k}': {first_line(e)})") \
                from None
        except Exception as e:  # noqa: BLE001 - zlib.error and other decompressor errors
            raise ValueError(f"--input file '{path}' is truncated or corrupt (array '{k}': "
                             f"{type(e).__name__}: {first_line(e)})") from None
    if not out:
        raise ValueError(f"--input file '{path}' holds no arrays; give one array per model input, named after it")
    return out


def _check_npz_member_size(path: str, f, key: str) -> None:
    """Refuse an array of the open ``.npz`` ``f`` whose header declares more bytes than half the
    host memory available (read from its ``.npy`` header, before numpy allocates it: a small
    compressed file can declare a huge array). Raises ``ValueError``."""
    member = key if key in f.zip.namelist() else f"{key}.npy"
    try:
        with f.zip.open(member) as fp:
            version = np.lib.format.read_magic(fp)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
            else:
                return              # numpy reads (and checks) other versions itself
    except Exception:  # noqa: BLE001 - a bad header: np.load's own error says what is wrong
        return
    nbytes = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    have = host_bytes_available()
    if nbytes > have // 2:
        raise ValueError(f"--input file '{path}': array '{key}' of shape {list(shape)} ({dtype}) would take "
                         f"{gib(nbytes)}, more than half of the {gib(have)} of host memory available")




def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are fed at run time (not initializers)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def set_batch_size(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of ``model`` whose run-time inputs have ``batch`` as their first dimension.

    Output and intermediate shapes are cleared so shape inference recomputes them. A model
    exported for a fixed batch has it baked into constants (``Reshape`` / ``Expand`` shapes, batch
    indices of attention masks ...): those are rewritten for the new batch by PopRT's batch-size
    pass, :func:`openipu.poprt.set_batch_size` (see :mod:`openipu.poprt.batch`).

    Raises ``ValueError`` naming the node when the model cannot follow the new batch.
    """
    from openipu.poprt import set_batch_size as poprt_set_batch_size
    return poprt_set_batch_size(model, batch)


def _dim_text(vi) -> str:
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                           for d in vi.type.tensor_type.shape.dim) + "]"


def fix_input_shapes(model: onnx.ModelProto, inputs: dict | None = None) -> onnx.ModelProto:
    """``model`` with every run-time input statically shaped, as PopART needs it.

    An input with symbolic or unknown dimensions takes them from the array given for it in
    ``inputs`` (its known dimensions must agree). Otherwise it is a ``ValueError`` that says how to
    give them: ``--batch-size`` (``batch_size=``) for a symbolic first dimension, ``--input`` for
    the others. A model whose inputs are all static is returned as it is.
    """
    todo = [vi for vi in model_inputs(model) if vi.type.HasField("tensor_type") and (
        not vi.type.tensor_type.HasField("shape")
        or any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim))]
    if not todo:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {vi.name: vi for vi in out.graph.input}
    for vi in todo:
        arr = (inputs or {}).get(vi.name)
        tt = by_name[vi.name].type.tensor_type
        if arr is not None:
            arr = np.asarray(arr)
            dims = tt.shape.dim
            if tt.HasField("shape") and (len(dims) != arr.ndim or any(
                    d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, arr.shape))):
                raise ValueError(f"input '{vi.name}' has shape {list(arr.shape)}; the model wants {_dim_text(vi)}")
            tt.ClearField("shape")
            for n in arr.shape:
                tt.shape.dim.add().dim_value = int(n)
            continue
        if not tt.HasField("shape"):
            raise ValueError(f"input '{vi.name}' has no shape in the model. Give it with --input FILE.npz (an array "
                             "named after the input), from which its shape is taken")
        dims = list(tt.shape.dim)
        first = dims[0] if dims else None
        if first is not None and not first.HasField("dim_value"):
            raise ValueError(f"input '{vi.name}' has shape {_dim_text(vi)}, whose first (batch) dimension "
                             f"'{first.dim_param or '?'}' is symbolic. Give the batch size with --batch-size N "
                             "(batch_size=N)" + (", and the other symbolic dimensions through --input FILE.npz"
                                                 if any(not d.HasField("dim_value") for d in dims[1:]) else ""))
        raise ValueError(f"input '{vi.name}' has shape {_dim_text(vi)}, with symbolic dimensions that --batch-size "
                         "(which sets the first dimension) does not fix. Give the input with --input FILE.npz (an "
                         "array named after the input), from which its shape is taken")
    return out


def only_inputs(model: onnx.ModelProto, names: list) -> onnx.ModelProto:
    """A shallow stand-in of ``model`` for :func:`random_inputs`: the run-time inputs ``names``,
    the Gather nodes and the initializers' shapes (no weight data is copied)."""
    m = onnx.ModelProto()
    keep = set(names)
    m.graph.input.extend(vi for vi in model.graph.input if vi.name in keep)
    m.graph.node.extend(n for n in model.graph.node if n.op_type == "Gather")
    gathered = {n.input[0] for n in m.graph.node if n.input}
    for t in model.graph.initializer:
        if t.name in gathered:
            m.graph.initializer.add(name=t.name, dims=list(t.dims), data_type=t.data_type)
    return m


def as_input(name: str, arr: np.ndarray, vi) -> np.ndarray:
    """``arr`` in the element type of model input ``vi``, checked: same shape; a float array
    only for a float input; integers only within the input type's range. Raises ``ValueError``."""
    dt = _NP_OF_ONNX.get(vi.type.tensor_type.elem_type)
    if dt is None:
        raise ValueError(f"input '{name}' has an ONNX element type openipu cannot feed "
                         f"({onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)})")
    want_shape = tuple(input_dims(vi))
    if arr.shape != want_shape:
        raise ValueError(f"input '{name}' has shape {list(arr.shape)}; the model wants {list(want_shape)}")
    want = np.dtype(dt)
    if arr.dtype == want:
        return arr
    kinds = "b" if want.kind == "b" else "biu" if want.kind in "iu" else "biuf"
    if arr.dtype.kind not in kinds:
        raise ValueError(f"input '{name}' is {arr.dtype}; the model wants {want} (convert it: openipu does not "
                         "round or truncate input values)")
    if want.kind in "iu" and arr.size:
        info = np.iinfo(want)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            raise ValueError(f"input '{name}' has values in [{lo}, {hi}], outside the range of the model's {want}")
    return arr.astype(want)


def input_dims(vi) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for the run-time inputs of ``model``, keyed by input name.

    Each in the input's own element type. Floats: standard normal. Integers used as ``Gather``
    indices: uniform in [0, rows of the gathered table); other integers and booleans: ones
    (masks). Unknown dims count as 1. Raises ``ValueError`` for element types openipu cannot
    feed (DOUBLE, strings, complex ...).
    """
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    bound = {}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[0] in inits:
            rows = inits[n.input[0]].dims[0] if inits[n.input[0]].dims else 1
            bound[n.input[1]] = min(bound.get(n.input[1], rows), rows)
    out = {}
    for vi in model_inputs(model):
        dt = _NP_OF_ONNX.get(vi.type.tensor_type.elem_type)
        if dt is None:
            raise ValueError(f"input '{vi.name}' has an ONNX element type openipu cannot feed "
                             f"({onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)})")
        shape = input_dims(vi)
        if np.issubdtype(dt, np.floating):      # drawn in float32 (not float64), then the input's type
            out[vi.name] = rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False)
        elif vi.name in bound:
            out[vi.name] = rng.integers(0, bound[vi.name], shape).astype(dt)
        else:
            out[vi.name] = np.ones(shape, dt)
    return out


def vi_bytes(vi) -> int:
    """Bytes of one value of ONNX value info ``vi`` (unknown dims count as 1)."""
    dt = _NP_OF_ONNX.get(vi.type.tensor_type.elem_type, np.float32)
    return int(np.prod(input_dims(vi), dtype=np.int64)) * np.dtype(dt).itemsize
