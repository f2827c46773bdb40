"""``openipu.poprt``: PopRT on the simulated IPU: ONNX converter passes (``poprt.converter``), the
compiler to a saved executable (``poprt.compiler``), the runtime (``poprt.runtime``) and serving
(``openipu.poprt.serving``)."""

from openipu.poprt import compiler, runtime
from openipu.poprt.batch import set_batch_size
from openipu.poprt.compiler import Compiler, CompilerOptions
from openipu.poprt.converter import convert_float_to_half
from openipu.poprt.runtime import DeviceManager, PackRunner, PackRunnerConfig, Runner, RuntimeConfig

__all__ = ["Compiler", "CompilerOptions", "DeviceManager", "PackRunner", "PackRunnerConfig", "Runner",
           "RuntimeConfig", "compiler", "convert_float_to_half", "runtime", "set_batch_size"]
