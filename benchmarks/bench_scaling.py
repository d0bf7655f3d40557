"""How auto_diff's cost grows with the model: a table over depth and width, and a very deep model.

Run: .venv/bin/python benchmarks/bench_scaling.py [--rounds N] [--threads N] [--deep]
Each configuration runs in its own process (peak RSS only grows), interleaving bare and
auto_diff rounds as bench_overhead.py does: the ratio is min over min (median beside it),
the extra peak RSS is auto_diff's over the bare run's, both models counted.

Default: the benchmark transformer (batch 8, seq 64, 4 heads) with 2/4/8/16 blocks and width
128/256/512. ``--deep``: a Sequential of 500/1,000/2,000 Linear(64, 64) + Tanh pairs (4,000
layers at most) on batch 64, where time and memory per layer must stay flat (linear growth).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS, WIDTHS, DEPTHS = (2, 4, 8, 16), (128, 256, 512), (500, 1000, 2000)


def one(kind: str, a: int, b: int, rounds: int) -> str:
    """Run in the child: ``kind`` is ``transformer`` (a blocks, width b) or ``deep`` (a pairs)."""
    import resource

    import numpy as np
    import paddle
    import torch

    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from bench_overhead import bare, interleaved, transformer_stack

    import nbdiff

    if kind == "transformer":
        t, p = transformer_stack("torch", a, b), transformer_stack("paddle", a, b)
        x = np.random.RandomState(0).randn(8, 64, b).astype("float32")
    else:
        t = torch.nn.Sequential(*[m for _ in range(a) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())])
        p = paddle.nn.Sequential(*[m for _ in range(a) for m in (paddle.nn.Linear(64, 64), paddle.nn.Tanh())])
        x = np.random.RandomState(0).randn(64, 64).astype("float32")
    nbdiff.assign_weight(t, p, inputs=x)
    bare(t, p, x)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ok = bool(nbdiff.auto_diff(t, p, x))
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    low, med = interleaved({"bare": lambda: bare(t, p, x), "auto": lambda: nbdiff.auto_diff(t, p, x)}, rounds)
    extra = (rss1 - rss0) / 1024
    return f"{low['bare'] * 1e3:.1f} {low['auto'] / low['bare']:.2f} {med['auto'] / med['bare']:.2f} {extra:.0f} {ok}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--deep", action="store_true", help="the 500 to 2,000 Linear+Tanh model instead")
    ap.add_argument("--configs", help="transformer blocks x width to run, e.g. 2x512,8x128 (default: the grid)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(one(args.child[0], int(args.child[1]), int(args.child[2]), args.rounds))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, threads {args.threads}, rounds {args.rounds}")
    grid = [("deep", n, 0) for n in DEPTHS] if args.deep else [("transformer", n, w) for n in LAYERS for w in WIDTHS]
    if args.configs:
        grid = [("transformer", *map(int, c.split("x"))) for c in args.configs.split(",")]
    print(
        "| model | bare | auto_diff min/min (median) | extra peak RSS | per block or layer | aligned |\n|---|---|---|---|---|---|"
    )
    for kind, a, b in grid:
        cmd = [sys.executable, __file__, "--rounds", str(args.rounds), "--child", kind, str(a), str(b)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"| {kind} {a} {b} | failed: {out.stderr.strip().splitlines()[-1:]} |", flush=True)
            continue
        bare_ms, ratio, median, extra, ok = out.stdout.split()[-5:]
        layers = 2 * a if kind == "deep" else a
        name = f"{a} x (Linear+Tanh)" if kind == "deep" else f"{a} blocks, d{b}"
        per = f"{float(bare_ms) * (float(ratio) - 1) / layers:.2f} ms, {float(extra) * 1024 / layers:.0f} KiB"
        print(f"| {name} | {float(bare_ms):.0f} ms | {ratio}x ({median}x) | +{extra} MiB | {per} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
