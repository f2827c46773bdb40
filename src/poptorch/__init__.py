"""Drop-in ``poptorch`` module: ``import poptorch`` gives :mod:`openipu.poptorch` (PopTorch's Python
API on the simulated IPU), so PopTorch scripts run unchanged. PopTorch's module paths
(``poptorch.poptorch_core``, ``poptorch._utils``, ``poptorch._impl``, ``poptorch._poplar_executor``
...) name the matching openipu modules."""

import importlib as _importlib
import sys as _sys

import openipu.poptorch as _openipu_poptorch
from openipu.poptorch import *  # noqa: F401,F403

for _name in dir(_openipu_poptorch):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_openipu_poptorch, _name)
__version__ = _openipu_poptorch.__version__
#: poptorch.<name> -> the openipu.poptorch module it is
_SUBMODULES = {"optim": "optim", "enums": "enums", "options": "options", "ops": "ops", "_impl": "_impl",
               "_utils": "_utils", "poptorch_core": "poptorch_core", "_poplar_executor": "executor",
               "_logging": "_logging", "_options_impl": "options", "_args_parser": "_utils",
               "_dataloader": "dataloader", "profiling": "profiling"}
for _sub, _mod in _SUBMODULES.items():
    _m = _importlib.import_module(f"openipu.poptorch.{_mod}")
    _sys.modules[f"{__name__}.{_sub}"] = _m
    globals()[_sub] = _m
del _name, _sub, _mod, _m
