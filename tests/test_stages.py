"""Pipeline stages and their micro-batches (gather/stages, gather/micro_batches): a 2-stage run of
torch's own ``torch.distributed.pipelining`` (GPipe and 1F1B, 4 micro-batches, gloo on CPU,
tests/pp_job.py), alone and with each stage tensor-parallel over 2 ranks, compared with one
process on the whole batch, and with each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbdiff
from nbdiff.errors import DumpError
from nbdiff.trace.dump.store import rank_dirs, read_dump
from nbdiff.trace.events import Phase
from tests.jobs import PP_JOB, agrees_or_blamed, edited, gathered_like, rank_dumps, run_job

pytest.importorskip("torch")

STATS = ("--dump-type", "statistics")


def _bug(rank: int, micro: int) -> tuple[str, ...]:
    return ("--bug-rank", str(rank), "--bug-micro", str(micro), "--bug-step", "1")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pp")
    run = lambda name, ranks, *extra: run_job(d / name, ranks, *extra, job=PP_JOB)  # noqa: E731
    return {
        "reference": run("reference", 0),
        "reference_stats": run("reference_stats", 0, *STATS),
        "gpipe": run("gpipe", 2, "--pp", "gpipe"),
        "1f1b": run("1f1b", 2, "--pp", "1f1b"),
        "gpipe_bug": run("gpipe_bug", 2, "--pp", "gpipe", *_bug(1, 2)),
        "1f1b_bug": run("1f1b_bug", 2, "--pp", "1f1b", *_bug(0, 1)),
        "1f1b_stats": run("1f1b_stats", 2, "--pp", "1f1b", *STATS),
        "1f1b_bug_stats": run("1f1b_bug_stats", 2, "--pp", "1f1b", *_bug(0, 1), *STATS),
        "pp_tp": run("pp_tp", 4, "--pp", "1f1b", "--tp"),
        "pp_tp_bug": run("pp_tp_bug", 4, "--pp", "gpipe", "--tp", *_bug(3, 2)),
    }


def test_each_stage_records_two_steps_of_four_micro_batches_and_not_the_schedules_shape_probe(jobs):
    for folder in sorted(rank_dirs(jobs["1f1b"]).values()):
        dump = read_dump(folder)
        # The schedule's first step runs each stage once on empty tensors first: it was a 5th call.
        assert len(dump.steps) == 2, folder
        for k in (0, 1):
            roots = [e.call for e in dump.steps[k] if e.phase is Phase.FORWARD and e.depth == 0]
            assert roots == [0, 1, 2, 3], (folder, k, roots)
    manifest = json.loads((jobs["1f1b"] / "rank1" / "manifest.json").read_text())
    assert (manifest["micro_batches"], manifest["mesh"]["names"], manifest["mesh"]["coordinate"]) == (4, ["pp"], [1])


@pytest.mark.parametrize("run", ["gpipe", "1f1b", "pp_tp"])
def test_every_tensor_of_a_pipelined_step_joins_to_the_single_process_runs(jobs, run):
    reference = rank_dumps(jobs["reference"])[0].steps
    for k, (whole, counted) in enumerate(gathered_like(jobs["reference"], jobs[run])):
        assert sum(counted.values()) == 62, (k, counted)  # the whole model's: both stages, the root's ends included
        assert [e.path for e in whole if e.phase is Phase.FORWARD][:3] == ["", "emb", "layers.0"]
        # Each call nests under the call it nests under in the whole model, the stages' roots made one.
        assert _nesting(whole) == _nesting(reference[k])


def _nesting(events: list) -> dict:
    """Each forward and backward call's parent call, and its depth."""
    out = {}
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        by_order = {e.order: e for e in events if e.phase is phase}
        for e in by_order.values():
            parent = by_order[e.parent] if e.parent is not None else None
            out[(phase, e.path, e.call)] = (parent.path if parent else None, e.depth)
    return out


@pytest.mark.parametrize(
    ("base", "raw"), [("reference", "gpipe"), ("reference", "1f1b"), ("gpipe", "1f1b"), ("reference", "pp_tp")]
)
def test_schedules_and_the_whole_batch_agree_without_a_word(jobs, base, raw):
    agrees_or_blamed(nbdiff.compare(jobs[base], jobs[raw]))


@pytest.mark.parametrize(
    ("base", "raw", "path", "rank", "shards"),
    [
        ("reference", "gpipe_bug", "layers.1.act", 1, "raw rank 1 (pp=1), micro-batch 2 of 4: its slice (shard(0)) "
         "differs; micro-batches 0, 1, 3 agree"),
        ("1f1b", "gpipe_bug", "layers.1.act", 1, "raw rank 1 (pp=1), micro-batch 2 of 4: its slice (shard(0)) "
         "differs; micro-batches 0, 1, 3 agree"),
        ("reference", "1f1b_bug", "layers.0.act", 0, "raw rank 0 (pp=0), micro-batch 1 of 4: its slice (shard(0)) "
         "differs; micro-batches 0, 2, 3 agree"),
        # Stage 1's micro-batch 2, followed into the tensor-parallel shard that made it wrong.
        ("reference", "pp_tp_bug", "layers.1.act", 3, "raw rank 3 (pp=1, tp=1), micro-batch 2 of 4: its slice "
         "(shard(0)) differs; micro-batches 0, 1, 3 agree"),
        ("1f1b", "pp_tp_bug", "layers.1.act", 3, "raw rank 3 (pp=1, tp=1), micro-batch 2 of 4: its slice "
         "(shard(0)) differs; micro-batches 0, 1, 3 agree"),
    ],
)  # fmt: skip
def test_a_bug_in_one_micro_batch_of_one_stage_is_blamed_at_its_layer_step_stage_and_micro_batch(
    jobs, base, raw, path, rank, shards
):
    agrees_or_blamed(nbdiff.compare(jobs[base], jobs[raw]), (1, "forward", path, rank), shards)


def test_statistics_dumps_of_a_pipelined_run_join_too(jobs):
    r = nbdiff.compare(jobs["reference_stats"], jobs["1f1b_stats"])
    assert r.aligned, r.report()
    assert r.warnings == (), r.warnings
    d = nbdiff.compare(jobs["reference_stats"], jobs["1f1b_bug_stats"]).first_divergence
    assert (d.step, d.phase.value, d.raw_path) == (1, "forward", "layers.0.act"), d.describe()
    assert d.shards == (
        "raw rank 0 (pp=0): its 4 micro-batches make it up; which one differs is not told (statistics only)"
    ), d.shards


def test_micro_batches_the_steps_calls_do_not_divide_into_are_refused(jobs, tmp_path):
    def three(m):
        m["micro_batches"] = 3

    with pytest.raises(DumpError, match=r"rank0: step 0 calls `<root>` 4 times, not a multiple of its 3 micro-batches"):
        nbdiff.compare(jobs["reference"], edited(jobs["gpipe"], tmp_path / "three", three))


def test_two_pipeline_dimensions_are_refused(jobs, tmp_path):
    def two(m):
        m["mesh"] = {**m["mesh"], "shape": [2, 1], "names": ["pp", "pp_inner"], "coordinate": [m["rank"], 0]}

    with pytest.raises(DumpError, match=r"2 pipeline dimensions \(pp, pp_inner\); nbdiff joins the stages of one"):
        nbdiff.compare(jobs["reference"], edited(jobs["gpipe"], tmp_path / "two", two))
