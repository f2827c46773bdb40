"""The runtime's descriptors, configuration and errors (``poprt.runtime``'s ``DataDesc``,
``InputMemoryView`` / ``OutputMemoryView``, ``DeviceManager``, ``RuntimeConfig``, ``Future``,
``PopRTRuntimeError``)."""

from __future__ import annotations

import datetime
import enum
import os
from concurrent.futures import Future as _CFuture

import numpy as np

from openipu.poprt.runtime._timing import default_timing

class PopRTRuntimeError(RuntimeError):
    """PopRT runtime errors (a ``RuntimeError``, as PopRT's binding raises): bad inputs or outputs,
    a bad executable file, a closed runner."""





class DataDesc:
    """A model input or output as PopRT's runtime describes it (``InputDesc`` / ``OutputDesc``).

    Attributes:
        name: the tensor name.
        shape: list of ints, one compiled batch (never times ``batches_per_step``); a fresh list at
            each read, so callers may change it (Byte MLPerf sets ``shape[0] = 1``).
        size_in_bytes: bytes of one batch.
        popef_contains_tensor_data: False (weights are not inputs here).
    Methods: ``numpy_data_type()`` (the numpy scalar type, e.g. ``numpy.float16``).
    Source: PopRT 1.4 user guide, "C++ API" (``DataDesc``) and "Python API" (``Runner``).
    """

    __slots__ = ("name", "_shape", "_dtype", "size_in_bytes", "popef_contains_tensor_data")

    def __init__(self, name: str, shape, dtype):
        self.name = name
        self._shape = tuple(int(d) for d in shape)
        self._dtype = np.dtype(dtype)
        self.size_in_bytes = int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize
        self.popef_contains_tensor_data = False

    @property
    def shape(self) -> list:
        return list(self._shape)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def data_type(self) -> str:
        return self._dtype.name

    @property
    def size(self) -> int:
        return self.size_in_bytes

    def numpy_data_type(self):
        return self._dtype.type

    def __repr__(self):
        return f"DataDesc(name={self.name!r}, shape={list(self._shape)}, dtype={self._dtype.name})"


class InputMemoryView(dict):
    """PopRT's ``InputMemoryView``: input arrays by name (a ``dict``), accepted by ``execute``
    wherever a dict is. The arrays are read, not kept, and must hold one batch each (or ``k``
    batches). Source: PopRT 1.1/1.2 user guide, "Python API" (``runner.execute(InputMemoryView,
    OutputMemoryView)``)."""


class OutputMemoryView(dict):
    """PopRT's ``OutputMemoryView``: writable output arrays by name (a ``dict``); ``execute``
    writes the results into them."""


def _case_hint(path) -> str:
    """For a missing file, a note naming a file of the same name in another letter case (Byte
    MLPerf's IPU backend writes ``executable_fp16.popef`` and loads ``executable_FP16.popef`` when
    the precision comes from its compile step rather than from the user)."""
    p = os.fspath(path)
    d, name = os.path.split(p)
    if os.path.exists(p) or not os.path.isdir(d or "."):
        return ""
    alike = [f for f in os.listdir(d or ".") if f.lower() == name.lower()]
    return f" ('{alike[0]}' is there: file names are case-sensitive)" if alike else ""


def _timeout_seconds(v) -> float:
    """``RuntimeConfig.timeout_ns`` in seconds (an int of nanoseconds or a ``datetime.timedelta``)."""
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    return float(v) / 1e9


class DeviceManager:
    """``poprt.runtime.DeviceManager()``: the (simulated) IPUs this host has.

    ``ipu_hardware_version()`` is ``"ipu21"`` (a C600 card) unless ``target=`` says otherwise;
    ``get_num_devices()`` is the number of IPUs of the card (1).
    """

    def __init__(self, target: str = "ipu21", num_devices: int = 1):
        self.target, self._n = target, int(num_devices)

    def ipu_hardware_version(self) -> str:
        return self.target

    def get_num_devices(self) -> int:
        return self._n

    def get_device(self, device_id: int = 0, num_ipus: int = 1):
        """A simulated device of ``num_ipus`` IPUs of this target (an openipu Poplar device)."""
        from openipu.ipu import target as ipu_target
        from openipu.poplar.device import IPUModel
        if not 0 <= device_id < self._n:
            raise PopRTRuntimeError(f"No device with id {device_id}: this host has {self._n}")
        m = IPUModel(self.target)
        m.numIPUs = num_ipus
        m.tilesPerIPU = ipu_target(self.target).tiles_per_ipu
        return m.createDevice()


class RuntimeConfig:
    """``poprt.runtime.RuntimeConfig()``.

    Fields: ``batching_dim`` (-1: off; else the dimension of every input and output along which
    batches of any size are split into compiled batches, the last one padded with zeros),
    ``timeout_ns`` (10 ms, PopRT's default; an int of nanoseconds or a ``datetime.timedelta``):
    with ``batches_per_step > 1``, how long a step waits for the next request before it ends
    (the flush; see the module docstring); 0 waits without a limit,
    ``validate_io_params`` (True: check names, shapes and dtypes of ``execute``'s arrays),
    ``check_package_hash`` (True: the executable file's SHA-256 check; it is always done),
    ``replica_to_device``, ``ring_buffer_size_multiplier`` (accepted and stored).

    openipu's own fields: ``timing`` (``"host"``: the program runs on the simulator and a call
    takes host time; ``"predicted"``: outputs are not computed and each execute completes when the
    simulated IPU would, see :mod:`openipu.poprt.runtime._timing`; default from the environment
    variable ``OPENIPU_TIMING``, else ``"host"``) and ``time_scale`` (predicted mode: wall seconds
    per predicted IPU second, 1.0).
    Raises ``ValueError`` when ``OPENIPU_TIMING`` holds another value than ``host`` / ``predicted``.
    """

    def __init__(self, **kw):
        self.batching_dim = -1
        self.timeout_ns = 10_000_000
        self.validate_io_params = True
        self.check_package_hash = True
        self.replica_to_device = {}
        self.ring_buffer_size_multiplier = 2
        self.device_wait_config = None
        self.timing = default_timing()
        self.time_scale = 1.0
        for k, v in kw.items():
            if not hasattr(self, k):
                raise AttributeError(f"'poprt.runtime.RuntimeConfig' object has no attribute '{k}'")
            setattr(self, k, v)


class Future:
    """The result of ``execute_async``: ``wait()`` blocks until done (raising the call's error),
    ``get()`` returns the outputs dict, ``done()`` polls."""

    def __init__(self, fut: _CFuture):
        self._f = fut

    def wait(self, timeout: float | None = None) -> None:
        self._f.result(timeout)

    def get(self, timeout: float | None = None) -> dict:
        return self._f.result(timeout)

    def done(self) -> bool:
        return self._f.done()


class PackAlgorithm(enum.Enum):
    """How :class:`PackRunner` places queued sequences into the rows of a batch: ``first_fit``
    puts each one (in arrival order) into the first row with room; ``next_fit`` only into the row
    being filled, opening the next row when it does not fit."""
    first_fit = 0
    next_fit = 1


class PackRunnerConfig:
    """``poprt.runtime.PackRunnerConfig(timeout_microseconds=..., max_valid_num=..., dynamic_input_name=...)``.

    Fields:
        timeout_microseconds: how long the oldest queued sample waits for a fuller batch (µs, host time).
        max_valid_num: most samples (sequences) in one batch, over all rows (0: no limit but the rows).
        dynamic_input_name: the input whose length is a sample's sequence length (e.g. ``input_ids``).
        algorithm: :class:`PackAlgorithm` (``first_fit`` by default).
    Methods:
        ``enable_input_single_row_mode(mask_name)``: packed mode. Several sequences share a row of
        the compiled sequence length; the ``mask_name`` input of the row holds each token's
        sequence number (1, 2, ... ; 0 for padding), which a model converted with the
        ``insert_attention_mask`` pass turns into a block-diagonal attention mask. Without it each
        sample takes a row of its own.
        ``enable_padding_remove_mode(mask_name, input_names)``: samples may come padded; a sample's
        length is the count of non-zero ``mask_name`` entries and ``input_names`` are cut to it.
    """

    def __init__(self, timeout_microseconds: int = 1000, max_valid_num: int = 0, dynamic_input_name: str = "",
                 algorithm: PackAlgorithm = PackAlgorithm.first_fit):
        self.timeout_microseconds = int(timeout_microseconds)
        self.max_valid_num = int(max_valid_num)
        self.dynamic_input_name = dynamic_input_name
        self.algorithm = algorithm
        self.single_row_input = ""
        self.unpack_info_name = ""
        self.delimiter_num = 0
        self.padding_remove_mask = ""
        self.padding_remove_inputs: list[str] = []

    def enable_input_single_row_mode(self, name: str, unpack_info_name: str = "", delimiter_num: int = 0) -> None:
        """Packed mode with ``name`` as the mask input (see the class docstring).
        ``unpack_info_name`` / ``delimiter_num`` (PopRT 1.4, the deberta model's ``Unpack`` op and
        zero delimiters between sequences) are stored; :class:`PackRunner` refuses a non-zero
        ``delimiter_num`` (not implemented)."""
        self.single_row_input = name
        self.unpack_info_name = unpack_info_name
        self.delimiter_num = int(delimiter_num)

    @property
    def algorithom(self) -> PackAlgorithm:
        """PopRT 1.1/1.2's spelling of :attr:`algorithm`."""
        return self.algorithm

    @algorithom.setter
    def algorithom(self, v: PackAlgorithm) -> None:
        self.algorithm = v

    def enable_padding_remove_mode(self, mask_name: str, input_names=()) -> None:
        self.padding_remove_mask = mask_name
        self.padding_remove_inputs = list(input_names)
