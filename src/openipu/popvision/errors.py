"""Errors of the ``pva`` reader (libpva raises ``pva.Error`` subclasses for bad reports)."""

from __future__ import annotations


class Error(RuntimeError):
    """Base class of every error the ``pva`` reader raises."""


class NotAReport(Error):
    """The file is not a profile (``profile.pop``) openipu or Poplar wrote."""


class UnsupportedFormat(Error):
    """The profile's format version is older or newer than this reader supports."""


class CorruptReport(Error):
    """The profile is truncated or damaged."""


class NotATrace(Error):
    """The file is not a System Analyser trace (Chrome trace event JSON)."""
