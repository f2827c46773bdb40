"""``openipu.poprt``: PopRT, the IPU inference compiler and runtime (``poprt`` drop-in module).

Converter side (this package): :class:`Converter` (``poprt.converter.Converter``), the passes
(:class:`Pass`, :func:`register`, :func:`get_registered_passes`), fp16 / fp8 conversion, and the
``poprt`` command line (:mod:`openipu.poprt.cli`).
"""

from openipu.poprt import passes
from openipu.poprt.batch import set_batch_size
from openipu.poprt.converter import Converter, ConverterError, convert_float_to_half
from openipu.poprt.passes import Pass, PassError, get_registered_passes, register

__all__ = ["Converter", "ConverterError", "Pass", "PassError", "convert_float_to_half", "get_registered_passes",
           "passes", "register", "set_batch_size"]
