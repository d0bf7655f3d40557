"""CSV tables of a result, one set per step (and rank): mapping, forward, backward, optimizer.

Like TroubleShooter's ``ts_api_mapping_{step}.csv`` / ``ts_api_forward_compare_{step}.csv``
/ ``ts_api_backward_compare_{step}.csv``: a spreadsheet view of every paired event.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import TYPE_CHECKING

from nbdiff.trace.events import Phase

if TYPE_CHECKING:
    from nbdiff.result import DiffResult

__all__ = ["write_tables", "MAPPING_COLUMNS", "COMPARE_COLUMNS"]

MAPPING_COLUMNS = ["base_path", "base_type", "base_call", "raw_path", "raw_type", "raw_call"]
COMPARE_COLUMNS = [
    "base_path", "raw_path", "tensor", "base_shape", "raw_shape", "max_abs", "max_rel", "mean_abs", "cosine",
    "nan_base", "nan_raw", "inf_base", "inf_raw", "ratio", "passed", "tolerance", "mode", "local_ratio", "note",
]  # fmt: skip


def write_tables(result: DiffResult, out_dir: str | os.PathLike[str], prefix: str = "") -> list[Path]:
    """Write the tables; returns the files written. File names end in ``_{step}`` (``_rank{r}_{step}``
    when the result spans several ranks)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = sorted({e.base.rank for e in result.events})
    written = []
    for rank in ranks:
        for step in sorted({e.base.step for e in result.events if e.base.rank == rank}):
            tag = f"rank{rank}_{step}" if len(ranks) > 1 else f"{step}"
            events = [e for e in result.events if e.base.rank == rank and e.base.step == step]
            forward = [e for e in events if e.base.phase is Phase.FORWARD]
            rows = [
                [e.base.path, e.base.type_name, e.base.call, e.raw.path, e.raw.type_name, e.raw.call] for e in forward
            ]
            written.append(_write(out / f"{prefix}mapping_{tag}.csv", MAPPING_COLUMNS, rows))
            for phase in Phase:
                rows = []
                for e in events:
                    if e.base.phase is not phase:
                        continue
                    local = {t.name: t.ratio for t in e.local or ()}
                    for t in e.tensors:
                        rows.append([
                            e.base.path, e.raw.path, t.name, list(t.base_shape), list(t.raw_shape), t.max_abs,
                            t.max_rel, t.mean_abs, t.cosine, t.nan_base, t.nan_raw, t.inf_base, t.inf_raw, t.ratio,
                            t.passed, t.tolerance.describe(), t.mode, local.get(t.name, ""), t.note,
                        ])  # fmt: skip
                if rows or phase in (Phase.FORWARD, Phase.BACKWARD):
                    written.append(_write(out / f"{prefix}{phase.value}_compare_{tag}.csv", COMPARE_COLUMNS, rows))
    return written


def _cell(value: object) -> object:
    # A layer named "=HYPERLINK(...)" must stay text in a spreadsheet, not become a formula.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([_cell(v) for v in row] for row in rows)
    return path
