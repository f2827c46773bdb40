"""Drop-in ``poprt`` module: ``import poprt`` gives :mod:`openipu.poprt` (PopRT's Python API on the
simulated IPU), so PopRT scripts (``from poprt import runtime``, ``from poprt.compiler import
Compiler``, ``from poprt.converter import Converter``, ``from poprt.passes import register``) run
unchanged."""

import sys as _sys

import openipu.poprt as _impl
from openipu.poprt import *  # noqa: F401,F403

for _name in dir(_impl):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_impl, _name)
for _sub in ("compiler", "runtime", "converter", "passes"):
    if hasattr(_impl, _sub):
        _sys.modules[f"{__name__}.{_sub}"] = getattr(_impl, _sub)
del _name, _sub
