"""``openipu.poplar``: Poplar's graph API on a simulated IPU.

Mirrors ``poplar::`` (Graph, Tensor, Type, Target, Device, IPUModel, DeviceManager, Engine,
programs in :mod:`openipu.poplar.program`, Poplar's exceptions) with Poplar's spelling. See
``shared/DESIGN.md`` section 3 for the simulation and the cost model.
"""

from openipu.poplar import program
from openipu.poplar.device import Device, DeviceManager, IPUModel, Target, TargetType, createOfflineTarget
from openipu.poplar.engine import (Engine, Executable, FieldData, VertexIntrospector, VertexPerfEstimate,
                                   compileGraph, format_tensor)
from openipu.poplar.errors import *  # noqa: F401,F403 - Poplar's exception classes
from openipu.poplar.graph import (ComputeSet, DataStream, FieldRef, Function, Graph, HostFunction, RemoteBuffer,
                                  ReplicatedStreamMode, TensorCloneMethod, VariableMappingMethod, VertexGroup,
                                  VertexRef)
from openipu.poplar.options import OptionFlags
from openipu.poplar.tensor import Interval, Tensor, append, concat
from openipu.poplar.quarter import QuarterMetadata, createConstantMetadataTensor, createVariableMetadataTensor
from openipu.poplar.types import (ALL_TYPES, BOOL, CHAR, FLOAT, HALF, INT, LONGLONG, QUARTER, QUARTER_METADATA, SHORT,
                                  SIGNED_CHAR, UNSIGNED_CHAR, UNSIGNED_INT, UNSIGNED_LONGLONG, UNSIGNED_SHORT, Type)
from openipu.poplar.vertex import InOut, Input, MultiVertex, Output, SupervisorVertex, Value, Vector, VectorList, Vertex
