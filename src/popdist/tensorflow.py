"""``popdist.tensorflow``: see :mod:`openipu.popdist.tensorflow`."""
from openipu.popdist.tensorflow import *  # noqa: F401,F403
from openipu.popdist.tensorflow import set_ipu_config  # noqa: F401
