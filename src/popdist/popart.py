"""``popdist.popart``: see :mod:`openipu.popdist.popart`."""
from openipu.popdist.popart import *  # noqa: F401,F403
from openipu.popdist.popart import configureSessionOptions, getDevice  # noqa: F401
