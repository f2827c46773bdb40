"""``ipu.ops``: IPU operations (only ``pipelining_ops`` enums and checks so far)."""

from . import pipelining_ops  # noqa: F401
