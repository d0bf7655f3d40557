"""Data parallelism as a layout (gather/data_parallel): DP x TP and FSDP + TP runs compared with a
one-process run on the global batch, with a TP=2 run, and with each other.

torch: real 4-rank jobs under ``torchrun`` with gloo, a ``(2, 2)`` mesh named ``("dp", "tp")``,
torch's own ``parallelize_module``, and either gradients averaged over ``dp`` by hand or
``fully_shard`` (tests/tp_job.py), or hybrid sharding. Each data-parallel rank trains on its
slice of the batch. paddle: its own ``paddle.DataParallel`` over 2 CPU processes (gloo,
tests/paddle_dp_job.py), and, where fleet's hybrid-parallel layers need an accelerator, a DP x TP
split written by hand; both given their mesh as sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nbdiff
from nbdiff.errors import DumpError
from nbdiff.trace.events import Phase
from tests.jobs import agrees_or_blamed, edited, gathered_like, run_job

pytest.importorskip("torch")
from tests.paddle_split import TorchWhole, paddle_ranks, record_torch_whole, recorded_as_ranks  # noqa: E402

BUG = ("--bug-step", "1")
"""From step 1 on, one rank's shard of the activation is wrong."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dp")
    stats = ("--dump-type", "statistics")
    return {
        "reference": run_job(d / "reference"),
        "reference_stats": run_job(d / "reference_stats", 0, *stats),
        "tp2": run_job(d / "tp2", 2),
        "dp_tp": run_job(d / "dp_tp", 4, "--dp", "2"),
        "dp_tp_bug": run_job(d / "dp_tp_bug", 4, "--dp", "2", "--bug-rank", "3", *BUG),
        "dp_tp_stats": run_job(d / "dp_tp_stats", 4, "--dp", "2", *stats),
        "dp_tp_bug_stats": run_job(d / "dp_tp_bug_stats", 4, "--dp", "2", "--bug-rank", "3", *BUG, *stats),
        "fsdp_tp": run_job(d / "fsdp_tp", 4, "--dp", "2", "--fsdp"),
        "fsdp_tp_bug": run_job(d / "fsdp_tp_bug", 4, "--dp", "2", "--fsdp", "--bug-rank", "2", *BUG),
        "fsdp_tp_stats": run_job(d / "fsdp_tp_stats", 4, "--dp", "2", "--fsdp", *stats),
        "hsdp": run_job(d / "hsdp", 4, "--hsdp"),
        "hsdp_bug": run_job(d / "hsdp_bug", 4, "--hsdp", "--bug-rank", "1", *BUG),
    }


@pytest.mark.parametrize("run", ["dp_tp", "fsdp_tp", "hsdp"])
def test_every_tensor_of_a_dp_x_tp_step_gathers_to_the_single_process_runs(jobs, run):
    # Activations joined along the batch, their gradients scaled to the global mean, parameter
    # gradients averaged (by hand) or taken as FSDP reduced and sharded them, updates likewise;
    # hybrid sharding's copies over dp_replicate taken once.
    for _, counted in gathered_like(jobs["reference"], jobs[run]):
        # Every parameter's gradient and update is there, step 0's too (FSDP's forward had begun
        # when step 0's gradients were looked up).
        assert counted == {Phase.FORWARD: 10, Phase.BACKWARD: 17, Phase.OPTIMIZER: 7}, counted


@pytest.mark.parametrize(("base", "raw"), [("reference", "dp_tp"), ("reference", "fsdp_tp"), ("tp2", "dp_tp"),
                                           ("tp2", "fsdp_tp"), ("dp_tp", "fsdp_tp"), ("reference", "hsdp"),
                                           ("hsdp", "fsdp_tp")])  # fmt: skip
def test_equivalent_layouts_agree_without_a_word(jobs, base, raw):
    agrees_or_blamed(nbdiff.compare(jobs[base], jobs[raw]))


@pytest.mark.parametrize(
    ("base", "raw", "rank", "place", "others"),
    [
        ("reference", "dp_tp_bug", 3, "dp=1, tp=1", "0, 1, 2"),
        ("tp2", "dp_tp_bug", 3, "dp=1, tp=1", "0, 1, 2"),
        ("reference", "fsdp_tp_bug", 2, "dp=1, tp=0", "0, 1, 3"),
        ("dp_tp", "fsdp_tp_bug", 2, "dp=1, tp=0", "0, 1, 3"),
    ],
)
def test_a_bug_in_one_ranks_shard_is_blamed_at_its_layer_step_and_place_on_the_mesh(
    jobs, base, raw, rank, place, others
):
    d = nbdiff.compare(jobs[base], jobs[raw]).first_divergence
    assert (d.step, d.phase.value, d.raw_path, d.rank) == (1, "forward", "act", rank), d.describe()
    assert d.shards == f"raw rank {rank} ({place}): its shard (shard(2)) differs; ranks {others} agree", d.shards


def test_statistics_dumps_of_dp_x_tp_runs_gather_and_say_what_they_cannot_add_up(jobs):
    fsdp = nbdiff.compare(jobs["reference_stats"], jobs["fsdp_tp_stats"])
    assert fsdp.aligned, fsdp.report()
    # FSDP reduced its gradients before they were read: their statistics join like any shard's.
    assert not [w for w in fsdp.warnings if "data-parallel" in w], fsdp.warnings
    dp = nbdiff.compare(jobs["reference_stats"], jobs["dp_tp_stats"])
    assert dp.aligned, dp.report()
    # Averaged by hand after they were read, each rank's own gradient is a part of a mean.
    assert [w for w in dp.warnings if "data-parallel rank computed from its own slice" in w], dp.warnings
    d = nbdiff.compare(jobs["reference_stats"], jobs["dp_tp_bug_stats"]).first_divergence
    assert (d.step, d.phase.value, d.raw_path) == (1, "forward", "act"), d.describe()
    assert "which rank's part differs is not told (statistics only)" in d.shards, d.shards


def test_each_rank_records_its_place_on_the_mesh_and_fsdps_strided_shards(jobs):
    manifest = json.loads((jobs["fsdp_tp"] / "rank2" / "manifest.json").read_text())
    assert manifest["mesh"] == {
        "shape": [2, 2], "names": ["dp", "tp"], "coordinate": [1, 0], "data_parallel": ["dp"], "reduce": "mean",
    }  # fmt: skip
    # FSDP's shard of a column-parallel weight was recorded as "replicate" over dp (torch's
    # _StridedShard is no Shard): its rows gathered in the wrong order.
    assert manifest["param_layouts"]["up"] == {
        "weight": "strided(0,2)@dp,shard(0)@tp",
        "bias": "strided(0,2)@dp,shard(0)@tp",
    }
    assert manifest["param_layouts"]["down"]["weight"] == "shard(0)@dp,shard(1)@tp"


def test_a_mesh_whose_places_do_not_match_the_ranks_is_refused(jobs, tmp_path):
    def wider(m):
        m["mesh"]["shape"] = [2, 3]

    with pytest.raises(DumpError, match=r"the mesh \{'dp': 2, 'tp': 3\} has 6 places, but 4 ranks were recorded"):
        nbdiff.compare(jobs["reference"], edited(jobs["dp_tp"], tmp_path / "wider", wider))

    def same_place(m):
        m["mesh"]["coordinate"] = [0, 0] if m["rank"] in (0, 1) else m["mesh"]["coordinate"]

    with pytest.raises(DumpError, match=r"both say they are at \(0, 0\)"):
        nbdiff.compare(jobs["reference"], edited(jobs["dp_tp"], tmp_path / "same", same_place))


def test_placements_that_disagree_with_the_mesh_are_refused(jobs, tmp_path):
    def renamed(m):
        m["mesh"]["names"] = ["data", "model"]
        m["mesh"]["data_parallel"] = ["data"]

    match = r"rank0: `up` in\[0\] \(step 0, forward\): laid out over mesh dimension 'tp', which the run's mesh"
    with pytest.raises(DumpError, match=match):
        nbdiff.compare(jobs["reference"], edited(jobs["fsdp_tp"], tmp_path / "renamed", renamed))

    def unsaid(m):
        del m["mesh"]

    # Without its mesh, a 2-d layout cannot be told apart: said, with the fix.
    with pytest.raises(DumpError, match=r"does not say the mesh. Record with nbdiff.record\(..., mesh="):
        nbdiff.compare(jobs["reference"], edited(jobs["fsdp_tp"], tmp_path / "unsaid", unsaid))


# --- paddle: a hand-written 2 x 2 split, its mesh given as sizes --------------------------------


def _record_paddle_dp_tp(out: Path, bug_rank: int = -1) -> Path:
    """Four ranks of the port: data-parallel group ``g`` trains on rows ``2g, 2g+1`` of the batch,
    its two tensor-parallel ranks each a column/row split of the MLP (tests/paddle_split), and the
    gradients are averaged over the groups by hand before each step. fleet's hybrid-parallel layers
    need an accelerator, so the split and the mesh are the user's: ``mesh={"dp": 2, "tp": 2}``."""
    paddle = pytest.importorskip("paddle")
    groups = [paddle_ranks(TorchWhole(), bug_rank, g) for g in (0, 1)]
    ranks = [m for group in groups for m in group]
    opts = [paddle.optimizer.SGD(0.1, parameters=m.parameters()) for m in ranks]
    x = paddle.to_tensor(np.random.default_rng(3).standard_normal((4, 8)).astype("float32"))
    with recorded_as_ranks(ranks, out, mesh={"dp": 2, "tp": 2}):
        for _ in range(2):
            for g, group in enumerate(groups):
                half = x[2 * g : 2 * g + 2]
                total = group[0].partial(half) + group[1].partial(half)
                for m in group:
                    m.total = total
                    m(half).square().mean().backward()
            for a, b in zip(*groups):  # the data-parallel all-reduce (mean) of each tp rank's gradients
                for p, q in zip(a.parameters(), b.parameters()):
                    mean = (p.grad + q.grad) / 2
                    p.grad.set_value(mean)
                    q.grad.set_value(mean)
            for opt in opts:
                opt.step()
                opt.clear_grad()
    return out


@pytest.mark.parametrize("bug_rank", [-1, 3])
def test_a_paddle_dp_x_tp_split_given_its_mesh_compares_with_a_torch_reference(tmp_path, bug_rank):
    pytest.importorskip("paddle")
    raw = _record_paddle_dp_tp(tmp_path / "paddle", bug_rank)
    base = record_torch_whole(tmp_path / "torch", TorchWhole())
    r = nbdiff.compare(base, raw, shards={"up": "column", "down": "row_partial"})
    shards = "raw rank 3 (dp=1, tp=1): its shard (shard(1)) differs; ranks 0, 1, 2 agree"
    agrees_or_blamed(r, *(((0, "forward", "act", 3), shards) if bug_rank >= 0 else ()))


# --- paddle: paddle.DataParallel over 2 CPU processes (gloo) ------------------------------------


def _paddle_dp_job(out: Path, bug_rank: int = -1) -> Path:
    import os
    import subprocess
    import sys

    from tests.jobs import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    job = [sys.executable, str(ROOT / "tests" / "paddle_dp_job.py"), str(out), str(bug_rank)]
    done = subprocess.run(job, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (out / "rank1").is_dir(), done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.parametrize("bug_rank", [-1, 1])
def test_paddles_own_data_parallel_given_its_mesh_compares_with_one_torch_process(tmp_path, bug_rank):
    torch = pytest.importorskip("torch")
    pytest.importorskip("paddle")
    from tests.dumps import X, pair

    torch.manual_seed(0)  # as the job builds its weights
    base, _ = pair()
    opt = torch.optim.SGD(base.parameters(), lr=0.1)
    with nbdiff.record(base, tmp_path / "torch"):
        for _ in range(2):
            base(torch.tensor(X)).mean().backward()
            opt.step()
            opt.zero_grad()
    r = nbdiff.compare(tmp_path / "torch", _paddle_dp_job(tmp_path / "paddle", bug_rank))
    shards = "raw rank 1 (dp=1): its shard (shard(0)) differs; rank 0 agrees"
    agrees_or_blamed(r, *(((0, "forward", "act", 1), shards) if bug_rank >= 0 else ()))
