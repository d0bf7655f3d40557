"""Errors raised by nbdiff: each says what went wrong, where, and how to fix it."""

from __future__ import annotations

__all__ = [
    "NbdiffError",
    "InputError",
    "ModelCallError",
    "PairingError",
    "WeightTransferError",
    "OptionError",
    "DumpError",
]


class NbdiffError(Exception):
    """Base of every error nbdiff raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through nbdiff's and the frameworks' internals:
        # the message already names the place and the fix; the user's own frames are kept.
        from nbdiff.trace.origin.stack import short_traceback

        return short_traceback(self)


class InputError(NbdiffError, TypeError):
    """The inputs given to nbdiff have the wrong form."""


class OptionError(NbdiffError, ValueError):
    """An option has a value nbdiff cannot use."""


class ModelCallError(NbdiffError):
    """Calling one of the user's models (or its loss/optimizer) raised.

    The user's own exception is chained as ``__cause__`` so their traceback is kept.
    """


class PairingError(NbdiffError):
    """Base and raw layers could not be paired."""


class WeightTransferError(NbdiffError):
    """Copying weights from base to raw failed; raw is left exactly as it was."""


class DumpError(NbdiffError):
    """A dump folder that cannot be written or read: the message names the file and the problem."""
