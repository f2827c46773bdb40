"""``ipu.ipu_compiler.compile``: run ``computation(*inputs)``.

Inside a step ``IPUStrategy.run`` runs on the simulated IPU it is traced as part of that step
(:mod:`._custom_step`); elsewhere TensorFlow runs it on the host CPU."""


def compile(computation, inputs=None):  # noqa: A001 - Graphcore's name
    """Returns the outputs of ``computation(*inputs)`` as a list (Graphcore returns the outputs
    of the compiled XLA cluster)."""
    outs = computation(*(inputs or []))
    if outs is None:
        return []
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]
