"""``compare``: two dumps written by :func:`nbdiff.record`, every step of every rank.

Each step goes through the same comparisons as a live one (:mod:`nbdiff.engine`), by a
:class:`~nbdiff.engine.recorded.comparer.RecordedComparer` per rank; what the dumps cannot give (a
replay) is judged from what they hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from nbdiff.engine.driver import Verdict
from nbdiff.engine.kept import KEEP_STEPS, KeptSteps
from nbdiff.engine.recorded.dump_steps import layer_args
from nbdiff.engine.recorded.gathered import whole_dumps
from nbdiff.engine.recorded.steps import compare_ranks
from nbdiff.engine.spec import Comparison
from nbdiff.errors import DumpError, OptionError
from nbdiff.gather.shards import Gathered
from nbdiff.result import DiffResult
from nbdiff.trace.dump.store import RankDump, manifest_of, rank_dirs, read_dump

__all__ = ["compare"]


def _world_size(rank_dir: os.PathLike[str]) -> int:
    """How many ranks the job that wrote this rank folder ran (its manifest's ``world_size``; 1 if unsaid)."""
    world = manifest_of(rank_dir).get("world_size")
    return world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else 1


def compare(
    dir_a: str | os.PathLike[str],
    dir_b: str | os.PathLike[str],
    *,
    atol: float | None = None,
    rtol: float | None = None,
    compare_mode: str = "strict",
    ignore_unmatched: bool = False,
    keep_steps: int = KEEP_STEPS,
    shards: Mapping[str, str] | None = None,
    framework_differences: str = "report",
) -> DiffResult:
    """Compare dump ``dir_b`` (raw) against ``dir_a`` (base): every rank, every step.

    The first divergence is the earliest step's, then the lowest rank's. Unmatched
    ranks or steps are an error unless ``ignore_unmatched``; unpaired events are
    reported in the result either way.

    Every step's worst errors are kept (``result.step_errors()``); events are kept for the first
    ``keep_steps`` steps and for the blamed step, so memory stays bounded by a few steps.

    A tensor-parallel run compares with a run of another degree (a single-process reference) as
    whole tensors: each step's shards are gathered (:mod:`nbdiff.gather.shards`) by the layouts the
    framework recorded (torch ``DTensor``), the layers' shard rules, and ``shards``
    (``{"layers.*.mlp.up": "column"}``, for layouts nobody recorded); each finding names the rank
    whose shard differs. A difference a known framework difference explains is a finding that fails
    only with ``framework_differences="fail"``.
    """
    spec = Comparison(atol, rtol, compare_mode, "both", framework_differences, keep_steps)
    ranks_a, ranks_b = _ranks_at_the_door(dir_a, dir_b, ignore_unmatched, shards)

    verdict = Verdict(framework_differences == "fail", keep_events=False)
    kept = KeptSteps(keep_steps)
    unfinished = lambda a, b, rank: _unfinished(a, b, rank, (dir_a, dir_b), ignore_unmatched)  # noqa: E731
    ranks = _rank_pairs(ranks_a, ranks_b, shards)
    first, unmatched = compare_ranks(ranks, spec.tol, compare_mode, verdict, kept, unfinished)
    if first is None:
        raise DumpError(f"{dir_a} and {dir_b} have no rank in common.")
    if not kept.compared:
        # Nothing compared is never agreement (a scope that matched nothing, only cut-short steps).
        raise DumpError(
            f"{dir_a} and {dir_b}: no event was compared ({'; '.join(verdict.warnings) or 'the dumps hold no events'}). "
            "Check the recording's mode/scope, and that each dump holds a complete step."
        )
    a, b = first
    return verdict.finish(
        (a.framework, b.framework, str(a.meta["model"]), str(b.meta["model"])),
        (tuple(unmatched.base.values()), tuple(unmatched.raw.values())),
        dict(
            atol=atol,
            rtol=rtol,
            compare_mode=compare_mode,
            keep_steps=keep_steps,
            dumps=(str(dir_a), str(dir_b)),
            framework_differences=framework_differences,
        ),  # fmt: skip
        events=kept.events(),
        notes=kept.summarised(),
        step_summary=tuple(kept.rows[k] for k in sorted(kept.rows)),
        recorded_arguments=(layer_args(a), layer_args(b)),
    )


def _rank_pairs(
    ranks_a: dict[int, Any], ranks_b: dict[int, Any], shards: Mapping[str, str] | None
) -> Iterator[tuple[int, RankDump, RankDump, Gathered | None]]:
    """Each rank of both dumps, read; or, for runs of different tensor-parallel degrees, both as
    one rank of whole tensors (with what gathered them)."""
    if _gathers(ranks_a, ranks_b, shards):
        a = [read_dump(ranks_a[r], lazy=True) for r in sorted(ranks_a)]
        b = [read_dump(ranks_b[r], lazy=True) for r in sorted(ranks_b)]
        gathered, whole_a, whole_b = whole_dumps(a, b, shards or {})
        yield 0, whole_a, whole_b, gathered
        return
    for rank in sorted(set(ranks_a) & set(ranks_b)):
        yield rank, read_dump(ranks_a[rank], lazy=True), read_dump(ranks_b[rank], lazy=True), None


def _gathers(ranks_a: dict[int, Any], ranks_b: dict[int, Any], shards: Mapping[str, str] | None) -> bool:
    """Whether a run is laid out over its ranks (recorded layouts, or the user's ``shards``): then
    both are compared as whole tensors, even of the same degree, since a rank's all-reduced output
    carries another rank's error (rank by rank, the lowest rank's copy would take the blame)."""
    return bool(shards) or any(
        (m := manifest_of(folder)).get("param_layouts") or m.get("mesh") or int(m.get("micro_batches", 1)) > 1
        for ranks in (ranks_a, ranks_b)
        for folder in ranks.values()
    )


def _unfinished(a: RankDump, b: RankDump, rank: int, dirs: tuple[Any, Any], ignore_unmatched: bool) -> list[str]:
    """Warnings for dumps of different lengths (an error unless ``ignore_unmatched``) or not closed."""
    out = []
    if len(a.steps) != len(b.steps):
        msg = f"rank {rank}: {dirs[0]} has {len(a.steps)} step(s), {dirs[1]} has {len(b.steps)}"
        if not ignore_unmatched:
            raise DumpError(msg + "; pass ignore_unmatched=True to compare the common steps.")
        out.append(msg + ": compared the common steps.")
    for dump in (a, b):
        if not dump.closed:
            out.append(
                f"{dump.path}: the recording did not end cleanly (crash or kill); its {len(dump.steps)} "
                "complete step(s) are compared."
            )
    return out


def _ranks_at_the_door(
    dir_a: Any, dir_b: Any, ignore_unmatched: bool, shards: Any
) -> tuple[dict[int, Any], dict[int, Any]]:
    """``shards`` checked, and each dump's rank folders (the same ranks unless ``ignore_unmatched``,
    or runs of different tensor-parallel degrees)."""
    if shards is not None and (
        not isinstance(shards, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in shards.items())
    ):
        raise OptionError(f"shards={shards!r}: expected a dict of layer path pattern to a shard rule name ('column').")
    ranks_a, ranks_b = rank_dirs(dir_a), rank_dirs(dir_b)
    if _gathers(ranks_a, ranks_b, shards):
        for ranks, d in ((ranks_a, dir_a), (ranks_b, dir_b)):
            # The job's size is its manifests': a copy without its last rank is no whole tensor either.
            world = max([len(ranks), *(_world_size(p) for p in ranks.values())])
            if sorted(ranks) != list(range(world)):
                missing = ", ".join(f"rank{r}" for r in range(world) if r not in ranks)
                raise DumpError(
                    f"{d} has ranks {sorted(ranks)} of a job of {world}: gathering shards needs every rank from 0 "
                    f"on (missing: {missing}; copy those folders in beside the others)."
                )
        return ranks_a, ranks_b
    if set(ranks_a) != set(ranks_b) and not ignore_unmatched:
        raise DumpError(
            f"{dir_a} has ranks {sorted(ranks_a)} but {dir_b} has {sorted(ranks_b)}; "
            "record every rank, or pass ignore_unmatched=True to compare the common ones."
        )
    return ranks_a, ranks_b
