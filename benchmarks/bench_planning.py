"""Weight planning time against the number of layers: it must grow linearly.

Plans (no copy) a ``Sequential`` of N ``Linear`` layers against another, torch to torch
(each layer copied whole: the case that was quadratic) and torch to paddle, and prints
the time per 1,000 layers, which stays flat when planning is linear.

    .venv/bin/python benchmarks/bench_planning.py [--sizes 2000 4000 8000]
"""

from __future__ import annotations

import argparse
import time

import paddle
import torch

from nbdiff.weights.assign import plan_weights


def _time(base: object, raw: object) -> float:
    t = time.perf_counter()
    plan_weights(base, raw)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000, 8000])
    args = parser.parse_args()
    for n in args.sizes:
        base = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(n)])
        same = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(n)])
        other = paddle.nn.Sequential(*[paddle.nn.Linear(2, 2) for _ in range(n)])
        tt, tp = _time(base, same), _time(base, other)
        print(
            f"{n:6d} layers | torch->torch {tt:6.2f} s ({tt / n * 1000:.3f} s per 1k) | "
            f"torch->paddle {tp:6.2f} s ({tp / n * 1000:.3f} s per 1k)",
            flush=True,
        )


if __name__ == "__main__":
    main()
