"""Cost of auto_diff relative to the bare cost: both models' forward+backward, back to back.

Run: .venv/bin/python benchmarks/bench_overhead.py [--rounds N] [--only NAME]
Prints, per model pair, the median time of bare / auto_diff / single_step and the
ratios, plus the extra peak RSS of auto_diff over the bare run.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import paddle
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nbdiff  # noqa: E402
from tests.fault_suite.models import BUILDERS  # noqa: E402

warnings.filterwarnings("ignore")


def transformer_stack(fw: str):
    ns_base = torch.nn.Module if fw == "torch" else paddle.nn.Layer
    layers = [BUILDERS["transformer"](fw, d=256, heads=4) for _ in range(4)]

    class Stack(ns_base):
        def __init__(self):
            super().__init__()
            self.blocks = (torch.nn.ModuleList if fw == "torch" else paddle.nn.LayerList)(layers)

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


def interleaved(fns: dict, rounds: int) -> dict:
    """Median seconds of each function, run in turn every round, so drift hits all alike."""
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=sorted(CASES), help="run one pair")
    args = ap.parse_args()
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
    ok = bool(nbdiff.auto_diff(t, p, x))
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    med = interleaved(
        {
            "bare": lambda: bare(t, p, x),
            "auto": lambda: nbdiff.auto_diff(t, p, x),
            "single": lambda: nbdiff.auto_diff(t, p, x, single_step=True),
        },
        rounds,
    )
    tb, ta, ts = med["bare"], med["auto"], med["single"]
    print(
        f"{name:12s} bare {tb * 1e3:8.1f} ms | auto_diff {ta * 1e3:8.1f} ms ({ta / tb:.2f}x) | "
        f"single_step {ts * 1e3:8.1f} ms ({ts / tb:.2f}x) | peak RSS +{(rss1 - rss0) / 1024:.0f} MiB | aligned={ok}"
    )


if __name__ == "__main__":
    main()
