"""PopART's older ``debugPrefix`` keyword, accepted where the op takes ``debugContext``.

Builder ops took ``debugPrefix="name"`` before the Poplar SDK 2.1 renamed the argument to
``debugContext`` (``popart.DebugContext``); much published PopART code still passes the old
keyword. :func:`rename_debug_prefix` maps it onto ``debugContext`` (giving both is a
``TypeError``, as for any argument given twice); :func:`accept_debug_prefix` applies that to
every public method of a class that has a ``debugContext`` parameter.
"""

from __future__ import annotations

import functools
import inspect

from openipu.popart.log import log

_warned = set()


def rename_debug_prefix(kw: dict, where: str) -> dict:
    """``kw`` with ``debugPrefix`` renamed ``debugContext`` (a one-time deprecation warning)."""
    if "debugPrefix" not in kw:
        return kw
    if "debugContext" in kw:
        raise TypeError(f"{where}() got both 'debugPrefix' and 'debugContext'")
    kw = dict(kw)
    kw["debugContext"] = kw.pop("debugPrefix")
    if where not in _warned:
        _warned.add(where)
        log("builder").warning(f"{where}: 'debugPrefix' is deprecated, use 'debugContext'")
    return kw


def accept_debug_prefix(cls):
    """Class decorator: public methods with a ``debugContext`` parameter also take ``debugPrefix``."""
    for name, fn in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        if "debugContext" not in inspect.signature(fn).parameters:
            continue

        def wrap(f):
            @functools.wraps(f)
            def method(self, *a, **kw):
                return f(self, *a, **rename_debug_prefix(kw, f.__name__))
            return method
        setattr(cls, name, wrap(fn))
    return cls
