"""``ipu.functional_ops`` / ``ipu.ops.functional_ops`` (Graphcore TF2 API)."""

import functools


def outlined_function(func=None, unique_sharding=False, keep_input_layouts=None, name=None):
    """Decorator: on the IPU the function's body is compiled once and called from every use
    (code reuse). Here the function runs as written at each call (TensorFlow's trace and tf2onnx
    inline it; the values are the same); usable as ``@outlined_function`` or
    ``@outlined_function(...)``."""
    def wrap(f):
        @functools.wraps(f)
        def call(*args, **kwargs):
            return f(*args, **kwargs)
        call.outlined = True
        return call
    return wrap(func) if func is not None else wrap
