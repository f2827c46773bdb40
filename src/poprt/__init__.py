"""Drop-in ``poprt`` module: ``import poprt`` gives :mod:`openipu.poprt` (PopRT's Python API on the
simulated IPU), so PopRT scripts (``from poprt import runtime``, ``from poprt.compiler import
Compiler``, ``from poprt.converter import Converter``, ``from poprt.passes.base_pass import
ImmutablePass``) run unchanged.

Every ``poprt.X.Y`` module is the same module object as ``openipu.poprt.X.Y`` (an import hook
maps the names), so a client that assigns to ``poprt.passes.base_pass.<name>`` changes what
openipu's converter sees."""

import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys

import openipu.poprt as _impl
from openipu.poprt import *  # noqa: F401,F403


class _Alias(_abc.MetaPathFinder, _abc.Loader):
    """Finds ``poprt.<sub>`` as the module ``openipu.poprt.<sub>`` (one module object, two names)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        real = "openipu.poprt" + fullname[len(__name__):]
        if _util.find_spec(real) is None:
            return None
        return _util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return _importlib.import_module("openipu.poprt" + spec.name[len(__name__):])

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Alias) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _Alias())

for _name in dir(_impl):
    if not _name.startswith("__") or _name == "__version__":
        globals()[_name] = getattr(_impl, _name)
for _sub in ("compiler", "runtime", "converter", "passes"):
    if hasattr(_impl, _sub):
        _sys.modules[f"{__name__}.{_sub}"] = getattr(_impl, _sub)
del _name, _sub
