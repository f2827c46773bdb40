"""PopRT's converter passes (``poprt.passes``): the :class:`Pass` base, :func:`register` for custom
passes, :func:`get_registered_passes`, and the built-in passes:

====================================  ==========================================================
``int64_to_int32``                    int64 graph inputs / outputs -> int32 (:mod:`.graph`)
``remove_initializer_from_input``     weights listed as graph inputs become constants (:mod:`.graph`)
``gelu_pattern``                      tanh GELU subgraph -> ``ai.graphcore::Gelu`` (:mod:`.patterns`)
``erf_gelu_pattern``                  erf GELU subgraph -> ``ai.graphcore::GeluErf`` (:mod:`.patterns`)
``layer_norm_pattern``                decomposed layer norm -> ``LayerNormalization`` (:mod:`.patterns`)
``pre_scale``                         attention scale moved from the scores onto Q (:mod:`.attention`)
``fused_attention``                   QK^T / softmax / PV -> ``ai.graphcore::FusedAttention`` (:mod:`.attention`)
``insert_attention_mask``             packed-sequence (block-diagonal) mask from the mask input (:mod:`.attention`)
``attention_padding``                 key sequence padded to a multiple of 16, masked (:mod:`.attention`)
``constant_folding``                  constant subgraphs evaluated, up to ``max_tensor_size`` (:mod:`.graph`)
``add_outputs``                       intermediate tensors made graph outputs (``--checkpoints``) (:mod:`.graph`)
``serialize_matmul``                  a MatMul split into serial parts (:mod:`.matmul`)
``serialize_matmul_add``              the same for MatMul + bias Add (:mod:`.matmul`)
``merge_matmul``                      MatMuls sharing an input merged into one (:mod:`.matmul`)
``merge_matmul_add``                  the same for MatMul + bias Add (:mod:`.matmul`)
``final_check``                       types and shapes of the result checked, warnings only (:mod:`.final_check`)
``shape_inference``                   ONNX shape inference tolerating ai.graphcore ops (:mod:`.shape_inference`)
``remove_duplicated_initializer``     equal initializers merged (:mod:`.remove_duplicated_initializer`)
``unique_name_for_nodes``             every node named, uniquely (:mod:`.apply_ir_pass`)
``apply_ir_pass``                     IR passes by name (:mod:`.apply_ir_pass`)
``sort_graph``, ``remove_input_cast`` topological order; input Casts folded (:mod:`.graph_order`)
``disable_fast_norm`` and others      accepted, no effect on the simulator (:mod:`.accepted`)
====================================  ==========================================================

Helper modules as PopRT names them: :mod:`.base_pass` (``ImmutablePass``,
``get_all_named_subclasses``), :mod:`.onnx_helper`, :mod:`.pattern_helper`,
:mod:`.shape_inference` (``infer_shapes``).
"""

from openipu.poprt.passes.base import GraphView, Pass, PassError, get_registered_passes, register
from openipu.poprt.passes.base_pass import ImmutablePass, get_all_named_subclasses

__all__ = ["GraphView", "ImmutablePass", "Pass", "PassError", "get_all_named_subclasses", "get_registered_passes",
           "register"]
