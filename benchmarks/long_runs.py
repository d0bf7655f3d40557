"""Long equivalent runs stay quiet, and a 1% bug that starts late is still found at its step.

Run: .venv/bin/python benchmarks/long_runs.py [--seeds 5] [--only watch|record]
- ``watch``: the fault suite's CNN in torch against its paddle port, train mode, Adam, 300 steps of
  the user's loop (a new batch each step), at lr/batch 1e-3/4, 1e-2/4, 1e-2/2 and 3e-3/8;
- ``record``: the MLP and the CNN, SGD with momentum 0.9 (lr 0.05, batch 8), 256 steps recorded on
  each side and compared, tensor and statistics dumps.
Each configuration runs once equivalent (must pass) and once with raw wrapped in a layer that scales
its output by 1.01 on the inputs the loop reaches from 80% of the run on (must be blamed at that
step). Prints one line per run and the counts; exits 1 if any run is wrong.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import paddle
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nbdiff  # noqa: E402
from tests.fault_suite.models import BUILDERS  # noqa: E402

warnings.filterwarnings("ignore")
MARK = 7.0
"""The first input value of the batches the late bug reacts to."""


class Late(paddle.nn.Layer):
    """The port's code path a long run reaches late (a long sequence, a rare class): 1% off there."""

    def __init__(self, inner: paddle.nn.Layer) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        out = self.inner(x)
        return out * 1.01 if float(x.flatten()[0]) == MARK else out


def _pair(kind: str, seed: int, late: bool) -> tuple[torch.nn.Module, paddle.nn.Layer]:
    torch.manual_seed(seed)
    paddle.seed(seed)
    t, p = BUILDERS[kind]("torch"), BUILDERS[kind]("paddle")
    nbdiff.assign_weight(t, p)
    return t, (Late(p) if late else p)


def _batch(rng: np.random.RandomState, shape: tuple[int, ...], k: int, start: int | None) -> np.ndarray:
    x = rng.randn(*shape).astype("float32")
    if start is not None and k >= start:
        x.flat[0] = MARK
    return x


def watched(seed: int, lr: float, batch: int, steps: int, late: bool) -> nbdiff.DiffResult:
    t, p = _pair("cnn", seed, late)
    topt, popt = torch.optim.Adam(t.parameters(), lr=lr), paddle.optimizer.Adam(lr, parameters=p.parameters())
    rng, start = np.random.RandomState(seed), int(steps * 0.8) if late else None
    sides = ((t, topt, torch.tensor, "zero_grad"), (p, popt, paddle.to_tensor, "clear_grad"))
    with nbdiff.watch(t, p) as w:
        for k in range(steps):
            x = _batch(rng, (batch, 3, 8, 8), k, start)
            for model, opt, tensor, clear in sides:  # base's step, then raw's, as a notebook cell runs them
                model(tensor(x)).pow(2).mean().backward()
                opt.step()
                getattr(opt, clear)()
    assert w.result is not None
    return w.result


def recorded(seed: int, kind: str, dump_type: str, steps: int, late: bool) -> nbdiff.DiffResult:
    t, p = _pair(kind, seed, late)
    shape, start, folder = (
        ((8, 3, 8, 8) if kind == "cnn" else (8, 16)),
        int(steps * 0.8) if late else None,
        tempfile.mkdtemp(),
    )
    for name, model in (("a", t), ("b", p)):
        is_torch = isinstance(model, torch.nn.Module)
        if is_torch:
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            opt = paddle.optimizer.Momentum(0.05, 0.9, parameters=model.parameters())
        rng = np.random.RandomState(seed)
        with nbdiff.record(model, f"{folder}/{name}", dump_type=dump_type):
            for k in range(steps):
                x = _batch(rng, shape, k, start)
                model(torch.tensor(x) if is_torch else paddle.to_tensor(x)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad() if is_torch else opt.clear_grad()
    return nbdiff.compare(f"{folder}/a", f"{folder}/b")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", choices=["watch", "record"])
    args = ap.parse_args()
    runs = []
    if args.only != "record":
        for lr, batch in ((1e-3, 4), (1e-2, 4), (1e-2, 2), (3e-3, 8)):
            for seed in range(args.seeds):
                for late in (False, True):
                    runs.append((f"watch adam lr={lr} batch={batch} seed={seed}", 300, late,
                                 lambda s=seed, lr=lr, b=batch, late=late: watched(s, lr, b, 300, late)))  # fmt: skip
    if args.only != "watch":
        for kind in ("mlp", "cnn"):
            for dump_type in ("tensor", "statistics"):
                for seed in range(args.seeds):
                    for late in (False, True):
                        runs.append((f"record sgd {kind} {dump_type} seed={seed}", 256, late,
                                     lambda s=seed, k=kind, d=dump_type, late=late: recorded(s, k, d, 256, late)))  # fmt: skip
    wrong = 0
    for name, steps, late, go in runs:
        d = go().first_divergence
        ok = d is None if not late else d is not None and d.step == int(steps * 0.8)
        wrong += not ok
        said = "quiet" if d is None else d.describe()
        print(f"{'ok   ' if ok else 'WRONG'} {name} {'late 1% bug' if late else 'equivalent'}: {said}", flush=True)
    print(f"{len(runs) - wrong} of {len(runs)} right")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
