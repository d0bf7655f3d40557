"""Cost of nbdiff.record against the bare training step, and the size of the dump.

Run: .venv/bin/python benchmarks/bench_dump.py [--rounds N]
For the CNN of the fault suite (batch 32x3x32x32) in torch and in paddle: median
time of one recorded SGD step (forward, backward, update, then writing the dump)
per dump type, as a ratio to the same step unrecorded, and the bytes written.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
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


def step(model, x, opt, fw):
    if fw == "torch":
        model(torch.tensor(x)).mean().backward()
        opt.step()
        opt.zero_grad()
    else:
        model(paddle.to_tensor(x)).mean().backward()
        opt.step()
        opt.clear_grad()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    x = np.random.RandomState(0).randn(32, 3, 32, 32).astype("float32")
    for fw in ("torch", "paddle"):
        model = BUILDERS["cnn"](fw)
        if fw == "torch":
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        else:
            opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
        step(model, x, opt, fw)
        times: dict[str, list[float]] = {"bare": []}
        sizes: dict[str, int] = {}
        kinds = [("statistics", False), ("tensor", False), ("tensor", True)]
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            step(model, x, opt, fw)
            times["bare"].append(time.perf_counter() - t0)
            for dump_type, api in kinds:
                label = dump_type + (" +api" if api else "")
                d = tempfile.mkdtemp()
                t0 = time.perf_counter()
                with nbdiff.record(model, d, dump_type=dump_type, api_level=api):
                    step(model, x, opt, fw)
                times.setdefault(label, []).append(time.perf_counter() - t0)
                sizes[label] = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())
                shutil.rmtree(d)
        bare = statistics.median(times["bare"])
        parts = [
            f"{k} {statistics.median(v) / bare:.2f}x, {sizes[k] / 2**20:.1f} MiB"
            for k, v in times.items()
            if k != "bare"
        ]
        print(f"{fw:7s} bare step {bare * 1e3:6.1f} ms | " + " | ".join(parts))


if __name__ == "__main__":
    main()
