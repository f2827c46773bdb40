"""Imports the modules that register PopRT's built-in passes."""

from openipu.poprt.passes import attention, graph, patterns  # noqa: F401
