"""Exceptions raised by ridgescope for misuse and bad input."""


class RidgescopeError(Exception):
    """A ridgescope call was misused or its input cannot be used; the message says which."""


class TraceFormatError(RidgescopeError, ValueError):
    """A file is not a readable ridgescope trace (or torch snapshot); the message names the
    problem and, where it applies, the byte offset."""
