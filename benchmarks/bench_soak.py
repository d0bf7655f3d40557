"""Soak: memory and time per step of a long ``watch`` and a long ``record``, printed every 50 steps.

Run: .venv/bin/python benchmarks/bench_soak.py [--watch-steps 500] [--record-steps 5000] [--memory-mib 256]
A small torch MLP (8 Linear+Tanh pairs, width 64, batch 32) against its paddle port, trained with
SGD. ``watch`` holds every step until the block ends (it compares them all, for the chart), so
its memory grows by what a step records beyond ``--memory-mib`` (arrays past it go to a file):
the printed anonymous memory per step is that growth. ``record`` writes each step and lets it go:
its memory must stay flat over 5,000 steps. Time per step is the mean since the last line (50 steps for watch, 250 for record).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nbdiff  # noqa: E402

warnings.filterwarnings("ignore")


def _anon_mib() -> float:
    gc.collect()
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def _models():
    import paddle
    import torch

    torch.manual_seed(0)
    tm = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())])
    pm = paddle.nn.Sequential(*[m for _ in range(8) for m in (paddle.nn.Linear(64, 64), paddle.nn.Tanh())])
    topt = torch.optim.SGD(tm.parameters(), lr=1e-3)
    popt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=pm.parameters())
    return tm, pm, topt, popt


def _report(name: str, i: int, last: float, every: int, base: float) -> float:
    now = time.perf_counter()
    mib = _anon_mib()
    print(f"{name} step {i + 1:5d}: {1e3 * (now - last) / every:6.2f} ms/step, anon {mib:7.1f} MiB ({mib - base:+.1f})")
    return time.perf_counter()  # the collection is not a step's time


def soak_watch(steps: int, memory_mib: float) -> None:
    import paddle
    import torch

    tm, pm, topt, popt = _models()
    x = np.random.RandomState(0).randn(32, 64).astype("float32")
    base = _anon_mib()
    last = time.perf_counter()
    with nbdiff.watch(tm, pm, memory_mib=memory_mib) as w:
        for i in range(steps):
            tm(torch.from_numpy(x)).mean().backward()
            topt.step()
            topt.zero_grad()
            pm(paddle.to_tensor(x)).mean().backward()
            popt.step()
            popt.clear_grad()
            if (i + 1) % 50 == 0:
                last = _report("watch ", i, last, 50, base)
        t = time.perf_counter()  # the block's end compares every step
    print(
        f"watch  compared {w.result.steps} steps in {time.perf_counter() - t:.1f} s: {'aligned' if w.result else 'DIVERGED'}"
    )


def soak_record(steps: int) -> None:
    import torch

    tm, _, topt, _ = _models()
    x = torch.from_numpy(np.random.RandomState(0).randn(32, 64).astype("float32"))
    base = _anon_mib()
    with tempfile.TemporaryDirectory() as d:
        last = time.perf_counter()
        with nbdiff.record(tm, Path(d) / "dump", dump_type="statistics"):
            for i in range(steps):
                tm(x).mean().backward()
                topt.step()
                topt.zero_grad()
                if (i + 1) % 250 == 0:
                    last = _report("record", i, last, 250, base)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--watch-steps", type=int, default=500)
    ap.add_argument("--record-steps", type=int, default=5000)
    ap.add_argument("--memory-mib", type=float, default=256.0)
    args = ap.parse_args()
    import os

    os.environ.setdefault("NBDIFF_PROGRESS", "0")
    soak_watch(args.watch_steps, args.memory_mib)
    soak_record(args.record_steps)


if __name__ == "__main__":
    main()
