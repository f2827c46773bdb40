"""``ipu.math_ops`` / ``ipu.ops.math_ops`` (Graphcore TF2 API)."""

import tensorflow as tf


def serialized_matmul(a, b, serialization_factor, serialization_dimension, transpose_a=False, transpose_b=False,
                      name=None):
    """``a @ b`` for ``a`` ``[..., m, k]`` and ``b`` ``[..., k, n]`` (after the transposes; float
    or int32, rank >= 2, matching batch dimensions) computed as ``serialization_factor`` smaller
    matmuls (less code and temporary memory on the IPU; the same values up to summation order).
    ``serialization_dimension``, in Graphcore's naming: ``"a_columns"`` splits the ``m``
    dimension (output rows), ``"a_rows_b_columns"`` the ``k`` dimension (partial products
    summed), ``"b_rows"`` the ``n`` dimension (output columns). TensorFlow's gradient of the
    slices, concatenations and sums is serialised the same way. Raises ``ValueError`` (Graphcore's
    texts) for a factor below 1 or not dividing the dimension, rank < 2 or another dimension name.
    In a program captured for the simulated IPU the matmul is one matmul (the serialisation is a
    memory plan the cost model does not take from here)."""
    from .._capture import capturing
    k = int(serialization_factor)
    if k < 1:
        raise ValueError("serialization_factor has to be at least 1, but was {}.".format(k))
    with tf.name_scope(name or "serialized_matmul"):
        a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
        if a.shape.ndims < 2:
            raise ValueError("Expected tensor 'a' to have a minimum rank of 2")
        if b.shape.ndims < 2:
            raise ValueError("Expected tensor 'b' to have a minimum rank of 2")
        if transpose_a:
            a = tf.linalg.matrix_transpose(a)
        if transpose_b:
            b = tf.linalg.matrix_transpose(b)
        if serialization_dimension not in ("a_columns", "a_rows_b_columns", "b_rows"):
            raise ValueError("Invalid serialization_dimension={}, expected one of: 'a_columns', "
                             "'a_rows_b_columns', 'b_rows'.".format(serialization_dimension))
        if capturing():
            return tf.matmul(a, b)
        if serialization_dimension == "a_columns":
            m = a.shape[-2]
            if m % k:
                raise ValueError("Expected 'serialization_factor' ({}) to divide the columns dimension of 'a' "
                                 "({}).".format(k, m))
            s = m // k
            return tf.concat([tf.matmul(a[..., i * s:(i + 1) * s, :], b) for i in range(k)], axis=-2)
        if serialization_dimension == "a_rows_b_columns":
            n_k = a.shape[-1]
            if n_k % k:
                raise ValueError("Expected 'serialization_factor' ({}) to divide the rows dimension of 'a' "
                                 "({}).".format(k, n_k))
            s = n_k // k
            out = tf.matmul(a[..., :s], b[..., :s, :])
            for i in range(1, k):
                out += tf.matmul(a[..., i * s:(i + 1) * s], b[..., i * s:(i + 1) * s, :])
            return out
        if serialization_dimension == "b_rows":
            n = b.shape[-1]
            if n % k:
                raise ValueError("Expected 'serialization_factor' ({}) to divide the rows dimension of 'b' "
                                 "({}).".format(k, n))
            s = n // k
            return tf.concat([tf.matmul(a, b[..., i * s:(i + 1) * s]) for i in range(k)], axis=-1)
        raise ValueError("Invalid serialization_dimension={}, expected one of: 'a_columns', 'a_rows_b_columns', "
                         "'b_rows'.".format(serialization_dimension))
