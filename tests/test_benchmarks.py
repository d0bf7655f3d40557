"""The benchmark scripts still run: each reaches into nbdiff's parts to time them, and a renamed part
broke ``bench_per_call.py`` unnoticed. Smallest sizes; what they print is not judged here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(
    "script,args,says",
    [
        ("bench_per_call.py", ["--pairs", "3", "--rounds", "1", "--threads", "1"], "nbdiff in all"),
        ("bench_watch.py", ["--depth", "3", "--steps", "2", "--rounds", "1", "--threads", "1"], "faithful floor"),
    ],
)
def test_a_benchmark_runs_at_its_smallest(script, args, says):
    env = {**os.environ, "TQDM_DISABLE": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert says in done.stdout
