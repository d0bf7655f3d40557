"""What comparing a tensor-parallel dump costs as its ranks grow: time and peak memory.

Run: .venv/bin/python benchmarks/bench_ranks.py [--ranks 1 4 16] [--steps 20] [--dp 2 [--fsdp]]
Records tests/tp_job.py (an embedding, a column- then row-parallel MLP, a head; SGD) in one process
and under torchrun with each number of ranks (gloo, CPU), then runs ``nbdiff.compare`` of each
against the one-process reference in a fresh process, and prints its wall time and peak RSS
(``ru_maxrss`` of that process). Each answer must be "aligned".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.jobs import run_job  # noqa: E402

COMPARE = """
import sys, time, resource
import nbdiff
t0 = time.perf_counter()
r = nbdiff.compare(sys.argv[1], sys.argv[2])
took = time.perf_counter() - t0
assert r.aligned, r.report()
print(f"{took:.2f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} {r.steps}")
"""


def record(out: Path, ranks: int, steps: int, *layout: str) -> None:
    run_job(out, ranks, "--steps", str(steps), *layout, timeout=1800)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--dp", type=int, default=1, help="data-parallel degree of each run of more ranks (mesh (dp, ranks/dp))"
    )
    ap.add_argument("--fsdp", action="store_true", help="with --dp: fully_shard over the data-parallel dimension")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        ref = Path(d) / "reference"
        record(ref, 0, args.steps)
        print(
            f"compare of a tensor-parallel dump against its one-process reference, {args.steps} steps, load {os.getloadavg()[0]:.2f}"
        )
        for n in args.ranks:
            out = Path(d) / f"tp{n}"
            t0 = time.perf_counter()
            layout = ["--dp", str(args.dp)] + (["--fsdp"] if args.fsdp else []) if n > args.dp > 1 else []
            record(out, n, args.steps, *layout)
            recorded = time.perf_counter() - t0
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
            run = subprocess.run(
                [sys.executable, "-c", COMPARE, str(ref), str(out)], env=env, capture_output=True, text=True
            )
            assert run.returncode == 0, run.stderr[-3000:]
            took, rss, steps = run.stdout.split()[-3:]
            size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
            print(
                f"{n:3d} ranks {' '.join(layout)}: compare {float(took):6.2f} s, peak RSS {rss} MiB, {steps} steps; dump {size:.1f} MiB (recorded in {recorded:.0f} s)"
            )


if __name__ == "__main__":
    main()
