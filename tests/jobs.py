"""Distributed jobs recorded as users run them: ``tests/tp_job.py`` in one process, or under
``torchrun`` (gloo, CPU) with some ranks; ``tests/pp_job.py`` likewise. For tests/test_gathered.py,
tests/test_data_parallel.py, tests/test_stages.py and benchmarks/bench_ranks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
