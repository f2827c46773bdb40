"""``openipu.poprt``: PopRT, the IPU inference compiler and runtime, on the simulated IPU (``poprt``
drop-in module): the converter (:class:`Converter`, ``poprt.converter``) and its passes
(:class:`Pass`, :func:`register`, :func:`get_registered_passes`; fp16 / fp8 conversion), the
compiler to a saved executable (``poprt.compiler``), the runtime (``poprt.runtime``), serving
(``openipu.poprt.serving``) and the ``poprt`` command line (:mod:`openipu.poprt.cli`)."""

#: The PopRT release whose Python API this mirrors, with openipu as the local part (PEP 440).
__version__ = "1.4.0+openipu"

from openipu.poprt import compiler, passes, runtime  # noqa: E402
from openipu.poprt.batch import set_batch_size  # noqa: E402
from openipu.poprt.compiler import Compiler, CompilerOptions  # noqa: E402
from openipu.poprt.converter import Converter, ConverterError, convert_float_to_half  # noqa: E402
from openipu.poprt.passes import Pass, PassError, get_registered_passes, register  # noqa: E402
from openipu.poprt.runtime import DeviceManager, PackRunner, PackRunnerConfig, Runner, RuntimeConfig  # noqa: E402

__all__ = ["__version__", "Compiler", "CompilerOptions", "Converter", "ConverterError", "DeviceManager", "PackRunner",
           "PackRunnerConfig", "Pass", "PassError", "Runner", "RuntimeConfig", "compiler", "convert_float_to_half",
           "get_registered_passes", "passes", "register", "runtime", "set_batch_size"]
