"""Cost of ``watch`` (the ``%%modeldiff`` path) relative to the bare loop: both models' steps, back to back.

Run: .venv/bin/python benchmarks/bench_watch.py [--rounds N] [--steps S] [--depth D] [--threads N] [--raw torch|paddle]
The user's loop: ``D`` x (Linear(32, 32) + Tanh) in torch against the same in paddle (``--raw torch``:
torch twice), SGD, ``S`` steps of forward, loss, backward and update on a batch of 16, each side
stepped right after its own call. Bare: the same loop without nbdiff. Watched: inside
``with nbdiff.watch(base, raw)``, the result compared when the block ends. Floor: the same loop with
every layer call's tensors and gradients copied and compared as :func:`floor_loop` says. Rounds alternate
bare, floor and watched in one process; prints per step the bare time, and min over min (median over
median) of the watched loop and of the floor against it, plus the extra peak RSS of the watched loop.
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
os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm loads: the progress bar would be timed too

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import floor  # noqa: E402

import nbdiff  # noqa: E402

warnings.filterwarnings("ignore")


def stack(fw: str, depth: int):
    """``depth`` Linear(32, 32) + Tanh pairs (watch copies base's weights into raw when it begins)."""
    nn = torch.nn if fw == "torch" else paddle.nn
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(32, 32), nn.Tanh())])


def loop(models: list[tuple[str, object]], steps: int, after_step=None) -> None:
    opts = [
        torch.optim.SGD(m.parameters(), lr=0.01)
        if fw == "torch"
        else paddle.optimizer.SGD(0.01, parameters=m.parameters())
        for fw, m in models
    ]
    rng = np.random.RandomState(1)
    for _ in range(steps):
        x = rng.randn(16, 32).astype("float32")
        for (fw, m), opt in zip(models, opts):
            out = m(torch.tensor(x) if fw == "torch" else paddle.to_tensor(x))
            (out * out).mean().backward()
            opt.step()
            opt.zero_grad() if fw == "torch" else opt.clear_grad()
        if after_step is not None:
            after_step()


def floor_loop(models: list[tuple[str, object]], steps: int) -> None:
    """The faithful floor of a watched loop (``floor.each_call`` on both models, every copy of a step
    compared with a tolerance once both sides ran it): what recording and comparing each layer call
    takes at the least, with no names, pairing, blame or updates."""
    kept: tuple[list, list] = ([], [])

    def compared() -> None:
        floor.compared_with_tolerance(*kept)
        kept[0].clear()
        kept[1].clear()

    with floor.each_call(models[0][1], kept[0].append), floor.each_call(models[1][1], kept[1].append):
        loop(models, steps, compared)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--threads", type=int, help="CPU threads for both frameworks (1: steadier on a shared machine)")
    ap.add_argument("--raw", choices=["paddle", "torch"], default="paddle")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bare, watched, floors, extra = [], [], [], []
    loop([("torch", stack("torch", args.depth)), (args.raw, stack(args.raw, args.depth))], 2)  # warm-up
    for _ in range(args.rounds):
        models = [("torch", stack("torch", args.depth)), (args.raw, stack(args.raw, args.depth))]
        t0 = time.perf_counter()
        loop(models, args.steps)
        bare.append((time.perf_counter() - t0) / args.steps)
        models = [("torch", stack("torch", args.depth)), (args.raw, stack(args.raw, args.depth))]
        t0 = time.perf_counter()
        floor_loop(models, args.steps)
        floors.append((time.perf_counter() - t0) / args.steps)
        models = [("torch", stack("torch", args.depth)), (args.raw, stack(args.raw, args.depth))]
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        with nbdiff.watch(models[0][1], models[1][1]) as w:
            loop(models, args.steps)
        watched.append((time.perf_counter() - t0) / args.steps)
        extra.append((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024)
        assert w.result is not None and w.result.first_divergence is None, w.result.report()
    lo = min(bare)
    print(
        f"watch, {args.depth} x (Linear(32,32)+Tanh), torch vs {args.raw}, SGD, {args.steps} steps, load "
        f"{os.getloadavg()[0]:.2f}: bare {lo * 1e3:.1f} ms/step | watch {min(watched) * 1e3:.1f} ms/step, {min(watched) / lo:.2f}x "
        f"({statistics.median(watched) / statistics.median(bare):.2f}x) | faithful floor {min(floors) / lo:.2f}x "
        f"({statistics.median(floors) / statistics.median(bare):.2f}x) | extra peak RSS {max(extra):.0f} MiB"
    )


if __name__ == "__main__":
    main()
