"""Built-in PopRT passes that change only how the real IPU computes, not what: on the simulator
they are accepted by name and leave the model as it is; each logs so once (``poprt.passes`` log,
level INFO).

====================================  =========================================================
``disable_fast_norm``                 (a converter option in PopRT) keep LayerNorm off the fast-norm kernel
``replace_groupnorm_with_fast_norm``  GroupNorm onto the fast-norm kernel
``matmul_rotary_embedding``           rotary position embedding as MatMuls
``auto_insert_remap``                 tensor re-layout ops after MatMuls (``enable_insert_remap``)
``overlap_io``                        I/O overlap annotations (``num_io_tiles`` does this here)
``model_overview``                    a printed summary of the model
====================================  =========================================================

Source: PopRT 1.4 user guide, "Python API", built-in passes; Byte MLPerf's
``interact_infos/*.json`` (``used_passes``, ``disable_fast_norm``, ``enable_insert_remap``).
"""

from __future__ import annotations

import logging

from openipu.poprt.passes.base import Pass, register

_log = logging.getLogger("poprt.passes")
_LOGGED: set = set()

_REASONS = {
    "disable_fast_norm": "the simulator's LayerNorm has one kernel",
    "replace_groupnorm_with_fast_norm": "GroupNorm lowers to PopLibs' group norm either way",
    "matmul_rotary_embedding": "the rotary embedding's result is the same; the cost model costs the ops as written",
    "auto_insert_remap": "the simulator's compiler chooses tensor layouts itself",
    "overlap_io": "overlapped I/O comes from CompilerOptions.num_io_tiles",
    "model_overview": "no summary is printed",
}


class _Accepted(Pass):
    reason = ""

    def run(self, model):
        if self.name not in _LOGGED:
            _LOGGED.add(self.name)
            _log.info("pass '%s' has no effect on the simulated IPU (%s); the model is unchanged",
                      self.name, self.reason)
        return model


for _name, _why in _REASONS.items():
    register(_name)(type("".join(w.title() for w in _name.split("_")), (_Accepted,),
                         {"reason": _why, "__module__": __name__,
                          "__doc__": f"``{_name}``: accepted, no effect on the simulator ({_why})."}))

__all__: list = []
