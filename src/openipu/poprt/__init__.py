"""``openipu.poprt``: ONNX converter passes in the manner of PopRT (``poprt.converter``)."""

from openipu.poprt.batch import set_batch_size
from openipu.poprt.converter import convert_float_to_half

__all__ = ["convert_float_to_half", "set_batch_size"]
