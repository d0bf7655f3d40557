"""nbdiff on CUDA: do the answers equal the CPU-only answers, and what does each verb cost there?

Run (on a machine with CUDA; numpy, safetensors and torch are all it needs):
    PYTHONPATH=. python benchmarks/bench_gpu.py [--rounds 3] [--width 1024] [--depth 8] [--batch 256]
``--device cpu`` runs the same script on the host (a dry run of the script: the "device" is the CPU).

A residual MLP (``depth`` x (LayerNorm, Linear(w, 2w), GELU, Linear(2w, w))), float32, SGD. Each pair is
compared three ways, equivalent and with one bug (block ``depth // 2`` takes GELU's tanh approximation):
``auto_diff`` (``--steps`` steps; ``single_step``: each raw layer fed base's values), ``watch`` around the user's loop, and ``record(dump_type="statistics")``
of each side (and ``"tensor"``) then ``compare``. Pairs: the device model against the same model on the CPU, and against
itself (both on the device). Each answer (success, or the first divergence's phase, step, paths and kind)
must equal the answer for the same pair with both models on the CPU. Prints per pair and verb the
answer check, min over min (median over median) of the verb's time against the bare loop (both models'
forward, backward and update, back to back, synchronized) and the device memory the verb adds to the
bare loop's peak. No paddle: its CPU wheel does not travel to the GPU machine (64 MiB), and a paddle
GPU build is a different wheel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nbdiff  # noqa: E402

warnings.filterwarnings("ignore")
os.environ.setdefault("TQDM_DISABLE", "1")


class Block(torch.nn.Module):
    def __init__(self, width: int, tanh: bool) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.act = torch.nn.GELU(approximate="tanh" if tanh else "none")
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, width: int, depth: int, bug: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(64, width)
        self.blocks = torch.nn.ModuleList(Block(width, bug and i == depth // 2) for i in range(depth))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def pair(args: argparse.Namespace, devices: tuple[str, str], bug: bool) -> tuple[Net, Net]:
    torch.manual_seed(0)
    base = Net(args.width, args.depth, False)
    raw = Net(args.width, args.depth, bug)
    raw.load_state_dict(base.state_dict())
    return base.to(devices[0]), raw.to(devices[1])


def batches(args: argparse.Namespace) -> list[np.ndarray]:
    rng = np.random.RandomState(1)
    return [rng.randn(args.batch, 64).astype("float32") for _ in range(args.steps)]


def user_loop(models: tuple[Net, Net], devices: tuple[str, str], xs: list[np.ndarray]) -> None:
    """The user's code: each side's forward, loss, backward and SGD step, one side after the other."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    for x in xs:
        for m, opt, d in zip(models, opts, devices):
            out = m(torch.from_numpy(x).to(d))
            (out * out).mean().backward()
            opt.step()
            opt.zero_grad()
    for d in set(devices):
        sync(d)


def answer(result: nbdiff.DiffResult) -> str:
    f = result.first_divergence
    if f is None:
        return "SUCCESS"
    return f"{f.phase.value if hasattr(f.phase, 'value') else f.phase} step {f.step} {f.base_path} ~ {f.raw_path} ({f.where})"


def run_auto_diff(args, models, devices, xs, single_step=False):
    inputs = xs[0] if single_step else tuple(torch.from_numpy(xs[0]).to(d) for d in devices)  # numpy: nbdiff places it
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    r = nbdiff.auto_diff(*models, inputs, optimizers=opts, steps=args.steps, single_step=single_step)
    for d in set(devices):
        sync(d)
    return r


def bare_auto_diff(args, models, devices, xs):
    user_loop(models, devices, [xs[0]] * args.steps)


def run_watch(args, models, devices, xs):
    with nbdiff.watch(*models) as w:
        user_loop(models, devices, xs)
    return w.result


def run_record(args, models, devices, xs, dump_type="statistics"):
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / "base", Path(tmp) / "raw"]
        opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
        for m, opt, d, folder in zip(models, opts, devices, dirs):
            with nbdiff.record(m, folder, dump_type=dump_type):
                for x in xs:
                    out = m(torch.from_numpy(x).to(d))
                    (out * out).mean().backward()
                    opt.step()
                    opt.zero_grad()
            sync(d)
        return nbdiff.compare(*dirs)


def bare_loop(args, models, devices, xs):
    user_loop(models, devices, xs)


VERBS = {
    "auto_diff": (run_auto_diff, bare_auto_diff),
    "single_step": (lambda a, m, d, xs: run_auto_diff(a, m, d, xs, single_step=True), bare_auto_diff),
    "watch": (run_watch, bare_loop),
    "record+compare": (run_record, bare_loop),
    "record_tensor": (lambda a, m, d, xs: run_record(a, m, d, xs, "tensor"), bare_loop),
}


def measure(args, devices: tuple[str, str], verb: str, bug: bool, reference: str | None) -> str:
    run, bare = VERBS[verb]
    xs = batches(args)
    on_device = "cuda" in devices
    times_bare, times_verb, extra = [], [], []
    got = None
    for _ in range(args.rounds):
        models = pair(args, devices, bug)
        if on_device:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        bare(args, models, devices, xs)
        times_bare.append(time.perf_counter() - t0)
        peak_bare = torch.cuda.max_memory_allocated() if on_device else 0
        models = pair(args, devices, bug)
        if on_device:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = run(args, models, devices, xs)
        times_verb.append(time.perf_counter() - t0)
        extra.append(((torch.cuda.max_memory_allocated() if on_device else 0) - peak_bare) / 2**20)
        got = answer(result)
    ok = "=" if reference is None or got == reference else f"DIFFERS from CPU-only ({reference})"
    return (
        f"{'/'.join(devices):10} {'bug' if bug else 'equal':5} {verb:15} {got} {ok} | "
        f"bare {min(times_bare) * 1e3:.0f} ms, {min(times_verb) / min(times_bare):.2f}x "
        f"({statistics.median(times_verb) / statistics.median(times_bare):.2f}x) | "
        f"device memory added {max(extra):.0f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--verbs", default=",".join(VERBS))
    ap.add_argument("--profile", action="store_true", help="then the top of a cProfile of one watch on the device")
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda":
        assert torch.cuda.is_available(), "no CUDA device: run with --device cpu for a dry run"
        print(
            f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CPU threads {torch.get_num_threads()}"
        )
    failures = 0
    for verb in args.verbs.split(","):
        for bug in (False, True):
            try:
                reference = answer(VERBS[verb][0](args, pair(args, ("cpu", "cpu"), bug), ("cpu", "cpu"), batches(args)))
                print(f"{'cpu/cpu':10} {'bug' if bug else 'equal':5} {verb:15} {reference} (the CPU-only answer)")
            except Exception:
                traceback.print_exc()
                reference = None
            for devices in ((dev, "cpu"), (dev, dev)):
                try:
                    line = measure(args, devices, verb, bug, reference)
                except Exception:
                    failures += 1
                    print(f"{'/'.join(devices):10} {'bug' if bug else 'equal':5} {verb:15} RAISED:")
                    traceback.print_exc(file=sys.stdout)
                    continue
                failures += "DIFFERS" in line
                print(line, flush=True)
    print(f"{failures} answer(s) differ or raised")
    if args.profile:
        import cProfile
        import pstats

        models, xs = pair(args, (dev, dev), False), batches(args)
        with cProfile.Profile() as prof:
            run_watch(args, models, (dev, dev), xs)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
