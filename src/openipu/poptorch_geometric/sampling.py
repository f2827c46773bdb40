"""Stub."""
def install():
    pass
