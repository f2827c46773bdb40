"""``popdist.poptorch``: see :mod:`openipu.popdist.poptorch`."""
from openipu.popdist.poptorch import *  # noqa: F401,F403
from openipu.popdist.poptorch import Options  # noqa: F401
