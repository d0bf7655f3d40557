"""Cost of auto_diff relative to the bare cost: both models' forward+backward, back to back.

Run: .venv/bin/python benchmarks/bench_overhead.py [--rounds N] [--only NAME] [--threads N]
Prints, per model pair, bare / floor / auto_diff / single_step: the headline is the
minimum over rounds divided by bare's minimum (the least disturbed runs), the median
ratio beside it, plus the extra peak RSS of auto_diff over the bare run (also in bounded
mode, ``memory_mib=0``: the recording goes to a file as it is made) and the load average. The floor is the least any such tool can cost: every layer of both models
hooked, each output and gradient copied once, one comparison pass.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

if "--threads" in sys.argv:  # before the frameworks load: their thread pools read it once
    os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import numpy as np
import paddle
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from floor import copies_once  # noqa: E402

import nbdiff  # noqa: E402
from tests.fault_suite.models import BUILDERS  # noqa: E402

warnings.filterwarnings("ignore")


def transformer_stack(fw: str, layers: int = 4, width: int = 256):
    ns_base = torch.nn.Module if fw == "torch" else paddle.nn.Layer
    blocks = [BUILDERS["transformer"](fw, d=width, heads=4) for _ in range(layers)]

    class Stack(ns_base):
        def __init__(self):
            super().__init__()
            self.blocks = (torch.nn.ModuleList if fw == "torch" else paddle.nn.LayerList)(blocks)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    return Stack()


CASES = {
    "mlp": (lambda fw: BUILDERS["mlp"](fw), (256, 16)),
    "cnn": (lambda fw: BUILDERS["cnn"](fw), (32, 3, 32, 32)),
    "transformer": (transformer_stack, (8, 64, 256)),
}


def bare(t, p, x):
    out = t(torch.tensor(x))
    out.float().mean().backward()
    out = p(paddle.to_tensor(x))
    out.astype("float32").mean().backward()
    t.zero_grad()
    p.clear_gradients()


def floor(t, p, x) -> None:
    """The least a comparing tool costs: hook every layer of both models, copy each output and
    each output gradient once, then compare them pairwise in one pass."""
    kept: dict = {"torch": [], "paddle": []}
    with copies_once(t, kept["torch"].append), copies_once(p, kept["paddle"].append):
        bare(t, p, x)
    for a, b in zip(kept["torch"], kept["paddle"]):
        if a.shape == b.shape:
            float(np.abs(a - b).max())


def interleaved(fns: dict, rounds: int) -> tuple[dict, dict]:
    """Minimum and median seconds of each function, run in turn every round, so drift hits all alike."""
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}, {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=sorted(CASES), help="run one pair")
    ap.add_argument("--threads", type=int, help="CPU threads for both frameworks (1: steadier on a shared machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, threads {args.threads or 'default'}")
    for name, (make, shape) in CASES.items():
        if args.only and name != args.only:
            continue
        run_case(name, make, shape, args.rounds)


def run_case(name: str, make, shape: tuple[int, ...], rounds: int) -> None:
    t, p = make("torch"), make("paddle")
    x = np.random.RandomState(0).randn(*shape).astype("float32")
    nbdiff.assign_weight(t, p, inputs=x)
    bare(t, p, x)  # warm-up, and the bare peak memory
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    nbdiff.auto_diff(t, p, x, memory_mib=0)  # bounded mode first: the peak only ever grows
    rss_bounded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ok = bool(nbdiff.auto_diff(t, p, x))
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    low, med = interleaved(
        {
            "bare": lambda: bare(t, p, x),
            "floor": lambda: floor(t, p, x),
            "auto": lambda: nbdiff.auto_diff(t, p, x),
            "single": lambda: nbdiff.auto_diff(t, p, x, single_step=True),
            "bounded": lambda: nbdiff.auto_diff(t, p, x, memory_mib=0),
        },
        rounds,
    )
    cols = [f"{name:12s} bare {low['bare'] * 1e3:7.1f} ms"]
    for key, label in (("floor", "floor"), ("auto", "auto_diff"), ("single", "single_step"), ("bounded", "bounded")):
        cols.append(f"{label} {low[key] / low['bare']:.2f}x (median {med[key] / med['bare']:.2f}x)")
    peaks = f"peak RSS +{(rss1 - rss0) / 1024:.0f} MiB (bounded +{(rss_bounded - rss0) / 1024:.0f} MiB)"
    print(" | ".join(cols) + f" | {peaks} | aligned={ok}")


if __name__ == "__main__":
    main()
