"""openipu: the Graphcore IPU software stack on a simulated IPU.

Layers (imports point down): ``ipu`` (targets) <- ``poplar`` (graph, programs, engine, cost
model) <- ``poplibs`` <- ``popart`` <- front ends.
"""

__version__ = "0.1.0"
