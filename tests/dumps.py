"""Helpers for the dump tests: record a few training steps of a fault-suite model."""

from __future__ import annotations

import numpy as np

import nbdiff
from tests.fault_suite.models import BUILDERS, inputs

X = inputs("mlp")


def pair(bug=None, base_fw="torch", raw_fw="paddle"):
    base, raw = BUILDERS["mlp"](base_fw), BUILDERS["mlp"](raw_fw, bug)
    nbdiff.assign_weight(base, raw, inputs=X)
    return base, raw


def train(model, path, steps=3, lr=0.1, late_bug_at=None, record_steps=None, **options):
    """Record ``steps`` SGD steps (``record_steps``: record's own ``steps``, the ones written); from step
    ``late_bug_at`` on, the model's fc2 output is scaled by 1.01."""
    if record_steps is not None:
        options["steps"] = record_steps
    import paddle
    import torch

    is_torch = isinstance(model, torch.nn.Module)
    if late_bug_at is not None:
        calls = {"n": 0}
        inner = model.fc2.forward

        def fc2(x):
            calls["n"] += 1
            out = inner(x)
            return out * 1.01 if calls["n"] > late_bug_at else out

        model.fc2.forward = fc2
    if is_torch:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())
    with nbdiff.record(model, path, **options) as rec:
        for _ in range(steps):
            x = torch.tensor(X) if is_torch else paddle.to_tensor(X)
            model(x).mean().backward()
            opt.step()
            opt.zero_grad() if is_torch else opt.clear_grad()
    return rec.path


def first_step_tensor(path):
    from nbdiff.trace.store import read_dump

    dump = read_dump(path)
    return dump, np.asarray(dump.steps[0][1].outputs[0].value)


def small_events():
    """One forward event with a NaN and an Inf, values and a stack: the dump-format tests' step."""
    from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
    from nbdiff.trace.stack import Frame

    x = np.array([[1.0, np.nan], [np.inf, -2.0]], "float32")
    return [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "fc", "Linear", 0, 1, None, True, (TensorRecord("in[0]", (2, 2), "float32", x),),
              (TensorRecord("out", (2, 2), "float32", x * 2),), args=("bias=True",), stack=(Frame("/u/m.py", 3, "forward"),)),
    ]  # fmt: skip
