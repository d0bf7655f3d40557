"""The parity matrix's cases and verbs: one port, run the way each verb is used, and its first finding.

Every verb compares the same whole step, so a bug is found at the same place whichever verb the user
picks: ``auto_diff`` (nbdiff runs the steps), ``watch`` (the user's loop), and ``record`` + ``compare``
(tensor and statistics dumps). A case builds both sides, the bug on raw's; ``direction`` says which
framework each side is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import nbdiff
from tests.fault_suite.models import BUGS, BUILDERS, inputs

STEPS = 2
LR = 0.05
VERBS = ("auto_diff", "watch", "compare tensor", "compare statistics")


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    bug: str | None = None
    """The fault suite's bug built into raw's model."""
    group_lr: float = 1.0
    """Raw's last layer's parameter group's learning rate, times the others'."""
    written: float = 1.0
    """Raw's last layer's weight scaled by this after step 1's update (outside the optimizer)."""
    train: bool = False
    """Train mode (BatchNorm's running statistics move)."""
    momentum_bug: bool = False
    """Raw's BatchNorms given the other framework's meaning of momentum."""
    blame: tuple[int, str, str, str] = (0, "", "", "")
    """The first divergence every verb must find: step, phase, base layer, kind of place."""


CASES = [Case(f"{kind} {bug}", kind, bug, blame=(0, *BUGS[kind, bug])) for kind, bug in BUGS] + [
    Case("cnn running statistics", "cnn", train=True, momentum_bug=True, blame=(0, "state", "bn1", "state")),
    Case("mlp group learning rate", "mlp", group_lr=3.0, blame=(0, "optimizer", "fc3", "parameter")),
    Case("mlp written outside the optimizer", "mlp", written=1.05, blame=(1, "optimizer", "fc3", "outside")),
    Case("mlp eps and a group learning rate", "mlp", "eps", group_lr=3.0, blame=(0, "forward", "norm", "layer")),
    Case(
        "mlp backward and a group learning rate", "mlp", "backward", group_lr=3.0, blame=(0, "backward", "mid", "layer")
    ),
]


def _last(model: Any) -> Any:
    """The layer a group learning rate or a write outside the optimizer is given."""
    return next(getattr(model, n) for n in ("fc3", "fc", "head", "fc2") if hasattr(model, n))


def models(case: Case, direction: str) -> tuple[Any, Any, str, str]:
    import paddle
    import torch

    bfw, rfw = direction.split("->")
    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = BUILDERS[case.kind](bfw), BUILDERS[case.kind](rfw, case.bug)
    nbdiff.assign_weight(base, raw, inputs=inputs(case.kind))
    if case.momentum_bug:
        for bn in (raw.bn1, raw.bn2):
            if rfw == "torch":
                bn.momentum = 0.9  # paddle's meaning: keep 90% of the old value
            else:
                bn._momentum = 0.1
    for m in (base, raw):  # paddle's LSTM has a backward in train mode only
        m.train() if case.train or case.kind == "lstm" else m.eval()
    return base, raw, bfw, rfw


def optimizer(model: Any, fw: str, group_lr: float = 1.0) -> Any:
    import paddle
    import torch

    last = {id(p) for p in _last(model).parameters()}
    rest = [p for p in model.parameters() if id(p) not in last]
    head = [p for p in model.parameters() if id(p) in last]
    if fw == "torch":
        return torch.optim.SGD([{"params": rest}, {"params": head, "lr": LR * group_lr}], lr=LR)
    return paddle.optimizer.SGD(LR, parameters=[{"params": rest}, {"params": head, "learning_rate": group_lr}])


def _tensor(fw: str, x: np.ndarray) -> Any:
    import paddle
    import torch

    return torch.tensor(x) if fw == "torch" else paddle.to_tensor(x)


def _loss(out: Any) -> Any:
    out = out[0] if isinstance(out, (tuple, list)) else out
    return (out * out).mean()


def _step(model: Any, fw: str, opt: Any, x: np.ndarray, after: Callable[[], None] | None = None) -> None:
    _loss(model(_tensor(fw, x))).backward()
    opt.step()
    opt.clear_grad() if fw == "paddle" else opt.zero_grad()
    if after is not None:
        after()


def _writer(case: Case, model: Any, fw: str, k: int) -> Callable[[], None] | None:
    if case.written == 1.0 or k != 1:
        return None

    def write() -> None:
        w = _last(model).weight
        if fw == "torch":
            import torch

            with torch.no_grad():
                w.mul_(case.written)
        else:
            w.set_value(w.numpy() * case.written)

    return write


def run(case: Case, direction: str, verb: str, folder: Any = None) -> nbdiff.DiffResult:
    """``case`` compared by ``verb`` (a ``compare`` writes its dumps under ``folder``)."""
    base, raw, bfw, rfw = models(case, direction)
    x = inputs(case.kind)
    bopt, ropt = optimizer(base, bfw), optimizer(raw, rfw, case.group_lr)
    if verb == "auto_diff":
        if case.written != 1.0:
            raise ValueError("auto_diff runs the steps itself: nothing of the user's runs between them")
        return nbdiff.auto_diff(base, raw, x, loss_fns=[_loss, _loss], optimizers=[bopt, ropt], steps=STEPS)
    if verb == "watch":
        with nbdiff.watch(base, raw) as w:
            for k in range(STEPS):
                _step(base, bfw, bopt, x)
                _step(raw, rfw, ropt, x, _writer(case, raw, rfw, k))
        return w.result
    dump_type = verb.split()[1]
    paths = []
    for name, model, fw, opt in (("a", base, bfw, bopt), ("b", raw, rfw, ropt)):
        with nbdiff.record(model, folder / name, dump_type=dump_type) as rec:
            for k in range(STEPS):
                _step(model, fw, opt, x, _writer(case, model, fw, k) if model is raw else None)
        paths.append(rec.path)
    return nbdiff.compare(*paths)


def findings(result: nbdiff.DiffResult) -> list[tuple[Any, ...]]:
    """What the matrix compares across verbs: each finding's step, phase, layer and kind, the first
    divergence first."""
    out = [(f.step, f.phase.value, f.base_path, f.where) for f in result.findings]
    d = result.first_divergence
    first = [] if d is None else [(d.step, d.phase.value, d.base_path, d.where)]
    return first + sorted(set(out) - set(first))
