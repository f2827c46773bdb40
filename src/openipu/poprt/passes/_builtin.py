"""Imports the modules that register PopRT's built-in passes."""

from openipu.poprt.passes import (accepted, apply_ir_pass, attention, final_check, graph,  # noqa: F401
                                  graph_order, matmul, patterns, remove_duplicated_initializer, shape_inference)
