"""``DiffResult``: the answer of a comparison, truthy when the models agree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.generation import Generation, generation, sequence_length
from nbdiff.judge.metrics import worst_ratio
from nbdiff.trace.events import Event, Kind, Phase

__all__ = ["DiffResult", "step_error_rows"]

StepRow = dict[str, Any]


@dataclass(frozen=True)
class DiffResult:
    """Everything ``auto_diff`` found. ``bool(result)`` is True when aligned."""

    base_framework: str
    raw_framework: str
    base_model: str
    raw_model: str
    first_divergence: Divergence | None
    """Where the models first disagree, or ``None``."""
    events: tuple[EventDiff, ...]
    """Every compared pair of events, by step, then forward/backward/optimizer, in execution order."""
    steps: int
    """Steps compared. ``auto_diff`` stops after the step where it diverged; ``watch`` and
    ``%%modeldiff`` compare every step the code ran, to show how the error grows."""
    unmatched_base: tuple[Event, ...] = ()
    unmatched_raw: tuple[Event, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """Findings that do not fail the result: inherited blips that vanish downstream."""
    options: dict[str, Any] = field(default_factory=dict)
    """The options used, after defaults."""
    findings: tuple[Divergence, ...] = ()
    """Every event whose own (local) error exceeds its tolerance, in execution order (forward,
    backward, optimizer updates, running statistics) of the step that diverged: a port with several
    bugs shows them all. ``first_divergence`` is the first of them."""
    step_summary: tuple[StepRow, ...] = ()
    """Every compared step's worst errors (:meth:`step_errors` rows), also of steps whose events
    were not kept: ``compare`` keeps a few steps' events so that memory stays bounded. Empty
    where every step's events are kept (``auto_diff``, ``watch``): they give the rows."""

    def __post_init__(self) -> None:
        if self.first_divergence is not None and not self.findings:
            object.__setattr__(self, "findings", (self.first_divergence,))

    def __bool__(self) -> bool:
        return self.first_divergence is None

    @property
    def aligned(self) -> bool:
        return self.first_divergence is None

    def select(self, step: int | None = None, phase: Phase | str | None = None) -> list[EventDiff]:
        """Compared events of one step and/or phase."""
        ph = Phase(phase) if phase is not None else None
        return [e for e in self.events if (step is None or e.base.step == step) and (ph is None or e.base.phase == ph)]

    def generation(self) -> Generation | None:
        """For a decode loop (inference, one new token per call after the prompt): each step's token
        positions, the first decode step and token position that diverge, and whether the divergence
        is late (past some position: a rotary, position or cache-offset bug) or early; else ``None``."""
        return generation(self.step_errors(), self.first_divergence)

    def step_errors(self) -> list[StepRow]:
        """Per step, the worst error over tolerance of the model's outputs, the loss, the gradients
        and the optimizer updates (``None`` where that step has none): how the error grows."""
        return [dict(r) for r in self.step_summary] if self.step_summary else step_error_rows(self.events)

    def plot(self) -> Any:
        """A matplotlib figure of :meth:`step_errors`, step by step (needs matplotlib)."""
        from nbdiff.view.plots import step_chart

        return step_chart(self.step_errors(), self.first_divergence.step if self.first_divergence else None)

    def plot_divergence(self) -> Any:
        """A matplotlib figure of the blamed tensor's error (histogram and error map), to save or share;
        ``None`` when nothing diverged or its values were not kept."""
        d = self.first_divergence
        if d is None or d.event is None:
            return None
        from nbdiff.view.plots import error_figure
        from nbdiff.view.tensors import CallIndex, tensor_pair

        # A layer's own code is shown by what it handed a sublayer (the local error's tensor).
        name = d.local_error.name if d.where == "between" and d.local_error is not None else d.metrics.name
        base, raw = tensor_pair(d.event, name, CallIndex(self.events))
        if base is None or raw is None or base.size != raw.size:
            return None
        return error_figure(base, raw, name)

    def report(self) -> str:
        """Readable text: summary, first divergence, a compact tree with it marked, both stacks."""
        from nbdiff.report.text import render_text

        return render_text(self)

    def show(self) -> Any:
        """The interactive view (needs the ``notebook`` extra): paired trees, tensors, stacks, replay."""
        from nbdiff.notebook.widget import DiffView

        return DiffView(self)

    def to_html(self, path: str | None = None) -> str:
        """A standalone HTML report (the view with the data embedded, no kernel, offline).

        With ``path``, the report is written there and the path is returned (the page is
        megabytes: as a cell's last line it would flood the output); without, the HTML.
        """
        from nbdiff.view.page import render_html, write_html

        return render_html(self) if path is None else str(write_html(self, path))

    def save(self, path: str) -> str:
        """Write the result to folder ``path`` (JSON plus safetensors, no pickle); ``nbdiff.load`` reads it."""
        from nbdiff.report.saved import save_result

        return str(save_result(self, path))

    def blamed_paths(self, side: str = "raw") -> list[str]:
        """The dotted paths of the layers the findings blame on ``side`` (``"base"`` or ``"raw"``): for
        a second, targeted recording, ``nbdiff.record(model, dir, tensors=result.blamed_paths("raw"))``.
        A layer's own code brings the sublayers around the fault (base's names only)."""
        if side not in ("base", "raw"):
            raise ValueError(f"side={side!r}: expected 'base' or 'raw'")
        out: list[str] = []
        for f in self.findings:
            path = (f.base_path if side == "base" else f.raw_path).partition("::")[0]
            around = [p for p in f.between if p] if side == "base" and f.where == "between" else []
            out += [p for p in (path, *around) if p not in out]
        return out

    def repro(self, path: str, divergence: Divergence | None = None) -> str:
        """Write ``path/repro.py`` and its data: a standalone script (no nbdiff needed) that rebuilds a
        blamed layer pair (``first_divergence``, or one of ``findings``), runs both on the recorded
        inputs and exits 1 while they differ. Returns the script's path."""
        from nbdiff.errors import OptionError
        from nbdiff.report.repro import write_repro

        chosen = divergence or self.first_divergence
        if chosen is None:
            raise OptionError("repro: the models agree, so there is no divergence to reproduce.")
        return str(write_repro(chosen, path))

    def to_json(self, path: str | None = None) -> str:
        """The verdict for machines (CI jobs, scripts): verdict, findings with phase, step, rank, paths,
        metrics and why, warnings and options, as versioned JSON text (``format: nbdiff-verdict``).
        With ``path``, also written there."""
        from nbdiff.report.verdict import write_verdict

        return write_verdict(self, path)

    def to_csv(self, out_dir: str) -> list[str]:
        """Mapping and compare tables per step (TroubleShooter-style CSVs); returns the files."""
        from nbdiff.report.tables import write_tables

        return [str(p) for p in write_tables(self, out_dir)]

    def __repr__(self) -> str:
        status = "SUCCESS" if self else f"FAILED at {self.first_divergence.describe()}"  # type: ignore[union-attr]
        return (
            f"<DiffResult {self.base_framework}:{self.base_model} vs {self.raw_framework}:{self.raw_model}: {status}>"
        )


def step_error_rows(
    events: tuple[EventDiff, ...] | list[EventDiff], into: dict[int, StepRow] | None = None
) -> list[StepRow]:
    """:meth:`DiffResult.step_errors` of these events, merged into ``into`` (by step, each
    column's worst) when given: ``compare`` adds each step's as it goes."""
    rows: dict[int, StepRow] = {} if into is None else into
    for d in events:
        e = d.base
        if (n := sequence_length(d)) is not None:
            row = rows.setdefault(e.step, dict(step=e.step, outputs=None, loss=None, gradients=None, updates=None))
            row.setdefault("tokens", n)
        if e.phase is Phase.FORWARD and e.kind is Kind.LAYER and e.parent is None:
            key = "outputs"
        else:
            key = {Phase.BACKWARD: "gradients", Phase.OPTIMIZER: "updates"}.get(e.phase)
            key = "loss" if e.kind is Kind.LOSS else key
        if key is None or not d.tensors:
            continue
        row = rows.setdefault(e.step, dict(step=e.step, outputs=None, loss=None, gradients=None, updates=None))
        row[key] = worst_ratio(d.tensors, row[key] or 0.0)
    return [rows[k] for k in sorted(rows)]
