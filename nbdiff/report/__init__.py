"""Reports of results: text."""

from __future__ import annotations

from nbdiff.report.text import format_diff, render_text

__all__ = ["format_diff", "render_text"]
