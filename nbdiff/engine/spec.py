"""One comparison's options as one checked value, and the flags the CLI and the magics make from it.

Every verb takes its options as keywords (``atol=``, ``compare_mode=``...) and builds a
:class:`Comparison` at the door: a bad value is an :class:`~nbdiff.errors.OptionError` naming the
option and the fix before any model runs, and the tolerance every stage uses is its :meth:`tol`.
The CLI's and the magics' flags are made by :func:`add_flags` from the same fields, so a choice or a
default is written once.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields
from typing import Any

from nbdiff.engine.kept import KEEP_STEPS
from nbdiff.engine.options import (
    FRAMEWORK_DIFFERENCES,
    PHASES,
    check_framework_differences,
    check_keep_steps,
    check_tolerances,
)
from nbdiff.errors import OptionError
from nbdiff.judge.metrics import COMPARE_MODES
from nbdiff.judge.tolerance import Tolerance, resolve_tolerance

__all__ = ["Comparison", "add_flags", "from_flags"]


@dataclass(frozen=True)
class Comparison:
    """How two runs are compared (every verb): checked when made."""

    atol: float | None = None
    rtol: float | None = None
    compare_mode: str = "strict"
    diff_phase: str = "both"
    framework_differences: str = "report"
    keep_steps: int = KEEP_STEPS

    def __post_init__(self) -> None:
        check_tolerances(self.atol, self.rtol, self.compare_mode)
        if self.diff_phase not in PHASES:
            raise OptionError(f"diff_phase={self.diff_phase!r} is not one of {PHASES}.")
        check_framework_differences(self.framework_differences)
        check_keep_steps(self.keep_steps)

    def tol(self, base_dtype: str, raw_dtype: str) -> Tolerance:
        """The tolerance of a base tensor of ``base_dtype`` against a raw one of ``raw_dtype``."""
        return resolve_tolerance(self.atol, self.rtol, base_dtype, raw_dtype)


_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "atol": ("--atol", dict(type=float, help="absolute tolerance (default: dtype-aware, relative to each tensor)")),
    "rtol": ("--rtol", dict(type=float, help="relative tolerance (default: dtype-aware)")),
    "compare_mode": ("--mode", dict(choices=COMPARE_MODES, help="compare mode")),
    "diff_phase": ("--phase", dict(choices=PHASES, help="what to compare: both, forward or backward")),
    "framework_differences": (
        "--framework-differences",
        dict(
            choices=FRAMEWORK_DIFFERENCES,
            help="a difference a known framework difference explains (paddle's biased BatchNorm running_var): "
            "report it (default) or fail on it",
        ),
    ),
    "keep_steps": (
        "--keep-steps",
        dict(
            type=int,
            metavar="N",
            help="keep the events of the first N steps (and the blamed one); later steps keep their worst errors only",
        ),  # fmt: skip
    ),
}


def add_flags(parser: argparse.ArgumentParser, *options: str) -> None:
    """A flag for each of ``options`` (fields of :class:`Comparison`), its default the field's."""
    defaults = {f.name: f.default for f in fields(Comparison) if f.default is not MISSING}
    for name in options:
        flag, kwargs = _FLAGS[name]
        parser.add_argument(flag, dest=name, default=defaults[name], **kwargs)


def from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`Comparison` options among parsed flags, as the verbs' keywords."""
    return {f.name: getattr(args, f.name) for f in fields(Comparison) if hasattr(args, f.name)}
