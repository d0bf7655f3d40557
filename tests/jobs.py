"""Distributed jobs recorded as users run them: ``tests/tp_job.py`` in one process, or under
``torchrun`` (gloo, CPU) with some ranks; ``tests/pp_job.py`` likewise. For tests/test_gathered.py,
tests/test_data_parallel.py, tests/test_stages.py and benchmarks/bench_ranks.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.gather.shards import Gathered
from nbdiff.trace.dump.store import rank_dirs, read_dump
from nbdiff.trace.events import Event, Phase

TP_JOB = Path(__file__).with_name("tp_job.py")
PP_JOB = Path(__file__).with_name("pp_job.py")
ROOT = TP_JOB.parent.parent


def run_job(out: Path, ranks: int = 0, *extra: str, timeout: float = 300, job: Path = TP_JOB) -> Path:
    """Record ``job`` into ``out``: in one process (``ranks=0``), or with ``ranks`` under torchrun
    (``tp_job.py`` with ``--tp``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if ranks:
        torchrun = Path(sys.executable).with_name("torchrun")
        cmd = [str(torchrun), "--standalone", f"--nproc_per_node={ranks}", str(job), str(out)]
        cmd += ["--tp", *extra] if job == TP_JOB else list(extra)
    else:
        cmd = [sys.executable, str(job), str(out), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def rank_dumps(path: Path) -> list:
    """Every rank of a dump, read, by rank."""
    return [read_dump(folder) for _, folder in sorted(rank_dirs(path).items())]


def edited(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of dump ``src`` at ``dst`` with every rank's manifest changed by ``edit``."""
    shutil.copytree(src, dst)
    for manifest in dst.glob("rank*/manifest.json"):
        data = json.loads(manifest.read_text())
        edit(data)
        manifest.write_text(json.dumps(data))
    return dst


def gathered_like(reference: Path, run: Path, steps: int = 2) -> list[tuple[list[Event], dict[Phase, int]]]:
    """Each step of ``run`` gathered whole, checked tensor by tensor against the one-process
    ``reference`` (shape, and values to float32 rounding), with how many tensors of each phase."""
    gathered = Gathered(rank_dumps(reference), rank_dumps(run))
    out = []
    for k in range(steps):
        whole_reference, whole = gathered.step(k)
        by_key = {(e.phase, e.path, e.call): e for e in whole}
        counted = {phase: 0 for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)}
        for e in whole_reference:
            if e.phase is Phase.WEIGHTS:
                continue
            mine = by_key[(e.phase, e.path, e.call)]
            assert mine.depth == e.depth, (e.path, mine.depth)
            for group in ("inputs", "outputs", "params"):
                joined = {t.name: t for t in getattr(mine, group)}
                for t in getattr(e, group):
                    g = joined[t.name]
                    assert g.shape == t.shape, (k, e.phase, e.path, t.name, g.shape, t.shape)
                    np.testing.assert_allclose(g.value, t.value, rtol=1e-4, atol=1e-6, err_msg=f"{k} {e} {t.name}")
                    counted[e.phase] += 1
        out.append((whole, counted))
    return out


def agrees_or_blamed(result: Any, blamed: tuple | None = None, shards: str | None = None) -> None:
    """``result`` agrees without a word (``blamed=None``), or its first divergence is at ``blamed``
    (step, phase, raw path, rank) and names the ranks ``shards`` says."""
    if blamed is None:
        assert result.aligned, result.report()
        assert result.warnings == (), result.warnings
        return
    d = result.first_divergence
    assert (d.step, d.phase.value, d.raw_path, d.rank) == blamed, d.describe()
    assert shards is None or d.shards == shards, d.shards
