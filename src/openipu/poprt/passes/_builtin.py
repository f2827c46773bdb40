"""Imports the modules that register PopRT's built-in passes."""

from openipu.poprt.passes import attention, graph, matmul, patterns  # noqa: F401
