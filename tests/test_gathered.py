"""A tensor-parallel run compared with a run of another degree (engine/gathered, offline.compare).

torch: real 2-rank jobs under ``torchrun`` with gloo and torch's own ``parallelize_module``
(tests/tp_job.py). paddle: fleet's parallel layers need an accelerator here, so a 2-way split is
written by hand as a port would hold it (each rank its columns of ``up``, its rows of ``down``,
``down``'s output a partial sum before the all-reduce) and described by the user's ``shards`` map.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nbdiff
from nbdiff.errors import DumpError, OptionError
from tests.jobs import run_job

torch = pytest.importorskip("torch")
from tests.paddle_split import TorchWhole, paddle_ranks, record_torch_whole, recorded_as_ranks  # noqa: E402


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tp")
    return {
        "reference": run_job(d / "reference"),
        "tp1": run_job(d / "tp1", 1),
        "tp2": run_job(d / "tp2", 2),
        "tp2_bug": run_job(d / "tp2_bug", 2, "--bug-rank", "1", "--bug-step", "1"),
        "reference_stats": run_job(d / "reference_stats", 0, "--dump-type", "statistics"),
        "tp2_stats": run_job(d / "tp2_stats", 2, "--dump-type", "statistics"),
        "tp2_bug_stats": run_job(
            d / "tp2_bug_stats", 2, "--bug-rank", "1", "--bug-step", "1", "--dump-type", "statistics"
        ),
    }


def test_a_tensor_parallel_run_agrees_with_its_single_process_reference(jobs):
    r = nbdiff.compare(jobs["reference"], jobs["tp2"])
    assert r.aligned, r.report()
    assert not [w for w in r.warnings if "not told" in w], r.warnings
    # Both directions, and TP=2 against TP=1 (a 1-rank mesh: every layout recorded, nothing split).
    assert nbdiff.compare(jobs["tp2"], jobs["reference"]).aligned
    assert nbdiff.compare(jobs["tp1"], jobs["tp2"]).aligned
    assert nbdiff.compare(jobs["tp2"], jobs["tp1"]).aligned


def test_a_tensor_parallel_dump_keeps_each_ranks_shard_and_its_layout(jobs):
    from nbdiff.trace.dump.store import rank_dirs, read_dump

    ranks = rank_dirs(jobs["tp2"])
    assert sorted(ranks) == [0, 1]
    dump = read_dump(ranks[1])
    assert dump.meta["param_layouts"]["up"] == {"weight": "shard(0)", "bias": "shard(0)"}
    assert dump.meta["param_layouts"]["down"] == {"weight": "shard(1)", "bias": "replicate"}
    update = next(e for e in dump.steps[0] if e.phase.value == "optimizer" and e.path == "up")
    weight = next(t for t in update.outputs if t.name == "weight")
    assert weight.shape == (16, 16) and weight.layout == "shard(0)"  # this rank's half of a [32, 16] weight


def test_a_bug_in_one_ranks_shard_is_blamed_at_its_layer_step_and_rank(jobs):
    r = nbdiff.compare(jobs["reference"], jobs["tp2_bug"])
    assert not r.aligned
    d = r.first_divergence
    assert (d.step, d.phase.value, d.raw_path, d.rank) == (1, "forward", "act", 1), d.describe()
    assert d.shards.startswith("raw rank 1: its shard (shard(2)) differs; rank 0 agrees"), d.shards
    assert "rank 1" in d.describe()
    assert not d.inherited
    # The verdict machines read says it too; TP=1 as the reference blames the same place.
    assert json.loads(r.to_json())["first_divergence"]["shards"] == d.shards
    d1 = nbdiff.compare(jobs["tp1"], jobs["tp2_bug"]).first_divergence
    assert (d1.step, d1.raw_path, d1.rank) == (1, "act", 1)


def test_statistics_dumps_of_a_tensor_parallel_run_gather_too(jobs):
    # What a big model records: statistics, joined per shard by their moments.
    r = nbdiff.compare(jobs["reference_stats"], jobs["tp2_stats"])
    assert r.aligned, r.report()
    # The input gradient of the column layer is a partial sum per rank: statistics cannot add it up.
    assert any("`up` in[0] (backward): partial sums kept as statistics only" in w for w in r.warnings)
    d = nbdiff.compare(jobs["reference_stats"], jobs["tp2_bug_stats"]).first_divergence
    assert (d.step, d.phase.value, d.raw_path) == (1, "forward", "act"), d.describe()
    assert d.shards.endswith("which rank's part differs is not told (statistics only)"), d.shards


def test_runs_of_the_same_degree_compare_as_whole_tensors(jobs):
    # Rank by rank, rank 0's all-reduced `down` output carries rank 1's error and took the blame.
    d = nbdiff.compare(jobs["tp2"], jobs["tp2_bug"]).first_divergence
    assert (d.step, d.raw_path, d.rank) == (1, "act", 1), d.describe()
    assert d.shards.startswith("raw rank 1: its shard"), d.shards


def test_ranks_missing_from_a_tensor_parallel_dump_are_refused(jobs, tmp_path):
    import shutil

    shutil.copytree(jobs["tp2"] / "rank1", tmp_path / "rank1")
    with pytest.raises(DumpError, match="every rank from 0"):
        nbdiff.compare(jobs["reference"], tmp_path)


def test_an_unknown_shard_rule_in_the_users_map_is_an_option_error(jobs):
    with pytest.raises(OptionError, match="no shard rule 'diagonal'"):
        nbdiff.compare(jobs["reference"], jobs["tp2"], shards={"up": "diagonal"})
    with pytest.raises(OptionError, match="expected a dict"):
        nbdiff.compare(jobs["reference"], jobs["tp2"], shards=["up"])


# --- paddle: a hand-written 2-way split, described by the user's map ---------------------------


def _record_paddle_split(out: Path, whole: TorchWhole, bug_rank: int = -1) -> Path:
    import paddle

    ranks = paddle_ranks(whole, bug_rank)
    opts = [paddle.optimizer.SGD(0.1, parameters=m.parameters()) for m in ranks]
    x = paddle.to_tensor(np.random.default_rng(3).standard_normal((4, 8)).astype("float32"))
    with recorded_as_ranks(ranks, out):
        for _ in range(2):
            total = ranks[0].partial(x) + ranks[1].partial(x)
            for m, opt in zip(ranks, opts):
                m.total = total
                m(x).square().mean().backward()
                opt.step()
                opt.clear_grad()
    return out


@pytest.mark.parametrize("bug_rank", [-1, 0])
def test_a_paddle_split_described_by_the_users_map_compares_with_a_torch_reference(tmp_path, bug_rank):
    pytest.importorskip("paddle")
    whole = TorchWhole()
    raw = _record_paddle_split(tmp_path / "paddle", TorchWhole(), bug_rank)
    base = record_torch_whole(tmp_path / "torch", whole)
    shards = {"up": "column", "down": "row_partial"}
    r = nbdiff.compare(base, raw, shards=shards)
    if bug_rank < 0:
        assert r.aligned, r.report()
        assert not [w for w in r.warnings if "not told" in w], r.warnings
        # Not told that `down` holds partial sums, rank 0's part is read as the whole: it must be said.
        told_nothing = nbdiff.compare(base, raw, shards={"up": "column"})
        assert not told_nothing.aligned
    else:
        d = r.first_divergence
        assert (d.step, d.phase.value, d.raw_path, d.rank) == (0, "forward", "act", 0), d.describe()
        assert d.shards.startswith("raw rank 0: its shard (shard(1)) differs; rank 1 agrees"), d.shards


def test_a_tensor_parallel_dump_missing_its_last_rank_is_refused_naming_it(jobs, tmp_path):
    # rank0 alone was compared as if its shard were the whole tensor: a false divergence, no word of rank1.
    import shutil

    shutil.copytree(jobs["tp2"] / "rank0", tmp_path / "rank0")
    with pytest.raises(DumpError, match="missing: rank1"):
        nbdiff.compare(jobs["reference"], tmp_path)
