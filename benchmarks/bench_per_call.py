"""Where auto_diff's time goes, per recorded layer call: the per-layer cost table.

Run: .venv/bin/python benchmarks/bench_per_call.py [--pairs N] [--rounds R] [--threads T]
A Sequential of ``N`` Linear(64, 64) + Tanh pairs (the deep model of ``bench_scaling.py``) in
torch and paddle, batch 64: the models' own work per layer is small, so what is left is
nbdiff's fixed cost per layer call, which an accelerator user sees whole. Each part is timed by
a wrapper around it (``time.perf_counter`` at its entry and exit, about 0.3 µs), summed over
``R`` runs of ``auto_diff`` after one warm-up, and divided by the layer calls recorded (both
models' forward calls, root included). Prints the minimum and median over rounds of each part
in µs per layer call ("rest": auto_diff less the parts and the fastest bare run), against the bare forward+backward of both models per layer call and
the floor of any such tool (every layer hooked, each output and gradient copied once, one
comparison pass: ``bench_overhead.py``'s), and the faithful floor: what recording a layer's own
input gradient takes at the least, compared with a tolerance (``floor.faithful``).

Parts: the forward hooks (before and after each call), the gradient hooks, building the
step's events from the calls (flush), comparing a step, pairing step 0 (and planning its
weights), the weight plan and copy before the first step, putting the hooks on and taking
them off, keeping the modes, state and random generators, the result; "rest" is the remainder
of auto_diff (running the models, the loss, bookkeeping).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

if "--threads" in sys.argv:  # before the frameworks load: their thread pools read it once
    os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import bare, floor  # noqa: E402
from floor import faithful  # noqa: E402

import nbdiff  # noqa: E402
import nbdiff.diff as diff_module
from nbdiff.engine.comparer import StepComparer  # noqa: E402
from nbdiff.engine.live.steps import LiveSteps  # noqa: E402
from nbdiff.trace import recorder as recorder_module  # noqa: E402

warnings.filterwarnings("ignore")
SPENT: dict[str, float] = defaultdict(float)


def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[part] += time.perf_counter() - t0

    return run


def hook_maker(part: str, make: Callable[..., Any]) -> Callable[..., Any]:
    """A method that makes hooks, made to hand out timed hooks."""

    def made(*args: Any, **kwargs: Any) -> Any:
        return timed(part, make(*args, **kwargs))

    return made


def instrument() -> None:
    rec = recorder_module.Recorder
    rec._pre = hook_maker("forward hooks", rec._pre)
    rec._post = hook_maker("forward hooks", rec._post)
    rec._grad_hook = hook_maker("gradient hooks", rec._grad_hook)
    recorder_module.build_events = timed("flush (build events)", recorder_module.build_events)
    StepComparer.compare = timed("compare", StepComparer.compare)
    StepComparer.pair = timed("pairing (step 0) and its weight plan", StepComparer.pair)
    diff_module._first_copy = timed("weight plan and copy", diff_module._first_copy)
    rec.__enter__ = timed("hooks put on and taken off", rec.__enter__)
    rec.remove = timed("hooks put on and taken off", rec.remove)
    LiveSteps.hold = timed("modes, state and generators kept", LiveSteps.hold)
    LiveSteps.result = timed("result", LiveSteps.result)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, help="CPU threads for both frameworks (1: steadier on a shared machine)")
    args = ap.parse_args()
    n = args.pairs
    t = torch.nn.Sequential(*[m for _ in range(n) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())])
    p = paddle.nn.Sequential(*[m for _ in range(n) for m in (paddle.nn.Linear(64, 64), paddle.nn.Tanh())])
    x = np.random.RandomState(0).randn(64, 64).astype("float32")
    nbdiff.assign_weight(t, p, inputs=x)
    calls = 2 * (2 * n + 1)  # both models' layer calls, the root's included
    instrument()
    bare(t, p, x)
    assert nbdiff.auto_diff(t, p, x)
    rounds: list[dict[str, float]] = []
    runs: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for name, fn in (
            ("bare", lambda: bare(t, p, x)),
            ("floor", lambda: floor(t, p, x)),
            ("faithful", lambda: faithful(t, p, lambda: bare(t, p, x))),
        ):
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
        SPENT.clear()
        t0 = time.perf_counter()
        nbdiff.auto_diff(t, p, x)
        runs["auto_diff"].append(time.perf_counter() - t0)
        rounds.append(dict(SPENT))
    fastest = min(runs["bare"])  # a round's own bare run is too noisy to subtract
    for r, total in zip(rounds, runs["auto_diff"]):
        r["rest"] = total - sum(r.values()) - fastest
    us = 1e6 / calls
    print(f"{n} Linear+Tanh pairs, {calls} layer calls per step, {args.rounds} rounds; µs per layer call")
    print("| part | min | median |\n|---|---:|---:|")
    for part in rounds[0]:
        values = [r[part] * us for r in rounds]
        print(f"| {part} | {min(values):.0f} | {statistics.median(values):.0f} |")
    low = {k: min(v) * us for k, v in runs.items()}
    mid = {k: statistics.median(v) * us for k, v in runs.items()}
    print(
        f"| **nbdiff in all** (auto_diff less bare) | {low['auto_diff'] - low['bare']:.0f} | {mid['auto_diff'] - mid['bare']:.0f} |"
    )
    print(
        f"| floor less bare (hooked, copied once, compared once) | {low['floor'] - low['bare']:.0f} | {mid['floor'] - mid['bare']:.0f} |"
    )
    print(
        "| faithful floor less bare (inputs and outputs copied, an autograd node per input, every gradient"
        f" hooked and copied, compared with a tolerance) | {low['faithful'] - low['bare']:.0f} | {mid['faithful'] - mid['bare']:.0f} |"
    )
    print(f"| bare forward+backward of both models | {low['bare']:.0f} | {mid['bare']:.0f} |")
    print(f"auto_diff {low['auto_diff'] / low['bare']:.2f}x bare (median {mid['auto_diff'] / mid['bare']:.2f}x)")


if __name__ == "__main__":
    main()
