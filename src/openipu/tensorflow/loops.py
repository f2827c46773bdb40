"""``ipu.loops``: ``repeat`` and ``while_loop``.

In a step ``IPUStrategy.run`` traces for the simulated IPU (:mod:`._custom_step`), ``repeat``
runs its body once and records the count (the program's ``batchesPerStep``); elsewhere both run
as Python loops by TensorFlow on the host CPU."""

import inspect

import tensorflow as tf


def _call(body, args, infeed_queue):
    from ._custom_step import active, fake_for
    extra = []
    kw = {}
    if infeed_queue is not None:
        el = next(fake_for(infeed_queue)) if active() is not None else next(infeed_queue._iterator)
        if isinstance(el, dict):
            kw = el
        elif isinstance(el, (tuple, list)):
            extra = list(el)
        else:
            extra = [el]
    try:
        inspect.signature(body).bind(*args, *extra, **kw)
    except TypeError as e:
        raise TypeError("Supplied loop body function cannot be called with the specified inputs. You specified "
                        f"{len(args)} inputs: {args}, with {len(extra) + len(kw)} additional inputs from infeed "
                        "queue.") from e
    return body(*args, *extra, **kw)


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def repeat(n, body, inputs=None, infeed_queue=None, use_while_v1=True):
    """Run ``body`` ``n`` times, carrying ``inputs`` (the body returns the new values) and
    taking one element of ``infeed_queue`` per iteration. Returns the final values."""
    from ._custom_step import _static_int, active
    vals = _as_list(inputs)
    trace = active()
    if trace is not None:
        if trace.iterations is not None:
            from ._custom_step import Unsupported
            raise Unsupported("nested or repeated loops in one step")
        trace.iterations = _static_int(n)
        n = 1
    for _ in range(int(n)):
        out = _call(body, vals, infeed_queue)
        vals = _as_list(out)
    return vals if len(vals) != 1 else vals[0] if inputs is not None and not isinstance(inputs, (list, tuple)) \
        else vals


def while_loop(condition, body, inputs=None, infeed_queue=None, maximum_iterations=None, use_while_v1=True):
    """Run ``body`` while ``condition(*values)`` holds (at most ``maximum_iterations`` times).
    Not traced for the simulated IPU (a data-dependent count): a step using it runs on the CPU."""
    from ._custom_step import Unsupported, active
    if active() is not None:
        raise Unsupported("ipu.loops.while_loop (a data-dependent trip count)")
    vals = _as_list(inputs)
    if not tf.executing_eagerly():      # in a tf.function on the CPU: TensorFlow's while loop
        return list(tf.while_loop(lambda *v: condition(*v), lambda *v: _as_list(_call(body, list(v), infeed_queue)),
                                  vals, maximum_iterations=maximum_iterations))
    i = 0
    while bool(tf.convert_to_tensor(condition(*vals))) and (maximum_iterations is None or i < maximum_iterations):
        vals = _as_list(_call(body, vals, infeed_queue))
        i += 1
    return vals
