"""Cost of nbdiff.record against the bare training steps, and the size of the dump.

Run: .venv/bin/python benchmarks/bench_dump.py [--rounds N] [--steps S] [--threads N] [--only torch|paddle]
For the CNN of the fault suite (batch 32x3x32x32) in torch and in paddle: ``S`` SGD steps
(forward, backward, update) recorded in one ``with nbdiff.record(...)`` block, dump written
and closed, against the same ``S`` steps unrecorded, interleaved round by round in one
process. Prints min over min (the headline) with the median ratio beside it, and the bytes
written per step. ``--steps 1`` includes the block's fixed cost (hooks, manifest) in the step.
Two floors run in the same rounds: every layer hooked and each output and output gradient
copied once (``floor``), and that plus the statistics of each copy (``floor+statistics``),
nothing written: what any recording tool pays before nbdiff's own work. A third line,
``framework statistics``, hooks the same tensors and has the framework reduce each to five
numbers (min, max, sum, sum of squares, sum of |x|) with no host copy: what statistics
computed on the framework's side would cost.
"""

from __future__ import annotations

import os
import sys

if "--threads" in sys.argv:  # before the frameworks load: their thread pools read it once
    os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from floor import copies_once, statistics_in_framework  # noqa: E402

import nbdiff  # noqa: E402
from nbdiff.trace.stats import tensor_stats  # noqa: E402
from tests.fault_suite.models import BUILDERS  # noqa: E402

warnings.filterwarnings("ignore")
KINDS = [("statistics", False), ("tensor", False), ("tensor", True)]


def step(model, x, opt, fw):
    if fw == "torch":
        model(torch.tensor(x)).mean().backward()
        opt.step()
        opt.zero_grad()
    else:
        model(paddle.to_tensor(x)).mean().backward()
        opt.step()
        opt.clear_grad()


def floor(model, x, opt, fw: str, steps: int, stats: bool | str) -> None:
    """The least any recording tool costs: every layer hooked, each output and output gradient
    copied once (``stats``: and its statistics computed, in the hook), nothing written;
    ``stats="framework"``: no copy, the statistics reduced by the framework itself."""
    hooked = (
        statistics_in_framework(model)
        if stats == "framework"
        else copies_once(model, tensor_stats if stats else lambda a: None)
    )
    with hooked:
        for _ in range(steps):
            step(model, x, opt, fw)


def bench(fw: str, rounds: int, steps: int) -> None:
    x = np.random.RandomState(0).randn(32, 3, 32, 32).astype("float32")
    model = BUILDERS["cnn"](fw)
    if fw == "torch":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    else:
        opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    step(model, x, opt, fw)
    times: dict[str, list[float]] = {"bare": []}
    sizes: dict[str, int] = {}
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            step(model, x, opt, fw)
        times["bare"].append(time.perf_counter() - t0)
        for label, stats in (("floor", False), ("floor+statistics", True), ("framework statistics", "framework")):
            t0 = time.perf_counter()
            floor(model, x, opt, fw, steps, stats)
            times.setdefault(label, []).append(time.perf_counter() - t0)
        for dump_type, api in KINDS:
            label = dump_type + (" +api" if api else "")
            d = tempfile.mkdtemp()
            t0 = time.perf_counter()
            with nbdiff.record(model, d, dump_type=dump_type, api_level=api):
                for _ in range(steps):
                    step(model, x, opt, fw)
            times.setdefault(label, []).append(time.perf_counter() - t0)
            sizes[label] = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file()) // steps
            shutil.rmtree(d)
    best, median = min(times["bare"]), statistics.median(times["bare"])
    parts = [
        f"{k} {min(v) / best:.2f}x ({statistics.median(v) / median:.2f}x)"
        + (f", {sizes[k] / 2**20:.1f} MiB" if k in sizes else "")
        for k, v in times.items()
        if k != "bare"
    ]
    print(f"{fw:7s} bare step {best / steps * 1e3:6.1f} ms | " + " | ".join(parts), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="steps recorded per record() block")
    ap.add_argument("--threads", type=int, help="CPU threads for both frameworks (1: steadier on a shared machine)")
    ap.add_argument("--only", choices=["torch", "paddle"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, threads {args.threads or 'default'}, "
          f"{args.steps} steps per record block; min/min (median/median)")  # fmt: skip
    for fw in ("torch", "paddle"):
        if args.only in (None, fw):
            bench(fw, args.rounds, args.steps)


if __name__ == "__main__":
    main()
