"""Drop-in ``pva`` module: ``import pva`` gives :mod:`openipu.popvision` (libpva's Python API over
the profiles openipu's engine writes), so PopVision analysis scripts run unchanged."""

import openipu.popvision as _impl
from openipu.popvision import *  # noqa: F401,F403

for _name in dir(_impl):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_impl, _name)
del _name
