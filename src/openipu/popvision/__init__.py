"""PopVision for openipu: the ``pva`` report reader (libpva's Python API), the Graph Analyser
HTML report (``openipu report``) and the System Analyser trace reader.

popvision reads what poplar writes (``profile.pop``, docs/profile-format.md; the PVTI trace); it
imports nothing above poplar.
"""

from openipu.popvision.errors import CorruptReport, Error, NotAReport, NotATrace, UnsupportedFormat
from openipu.popvision.report import (CATEGORY_NAMES, SUPPORTED_FORMAT_VERSIONS, Compilation, ComputeSet,
                                      Execution, ExecutionStep, ExecutionStepVisitor, Program, ProgramVisitor,
                                      Report, Run, Tile, openReport)

__all__ = ["CATEGORY_NAMES", "SUPPORTED_FORMAT_VERSIONS", "Compilation", "ComputeSet", "CorruptReport", "Error",
           "Execution", "ExecutionStep", "ExecutionStepVisitor", "NotAReport", "NotATrace", "Program",
           "ProgramVisitor", "Report", "Run", "Tile", "UnsupportedFormat", "openReport", "openTrace"]


def openTrace(path):  # noqa: N802
    """Read a System Analyser trace (see :mod:`openipu.popvision.trace`)."""
    from openipu.popvision.trace import openTrace as _open
    return _open(path)
