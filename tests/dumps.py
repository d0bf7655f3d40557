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


def train(model, path, steps=3, lr=0.1, late_bug_at=None, record_steps=None, after_update=None, fc3_lr=1.0, **options):
    """Record ``steps`` SGD steps (``record_steps``: record's own ``steps``, the ones written); from step
    ``late_bug_at`` on, the model's fc2 output is scaled by 1.01. ``after_update(k, model)``: the user's
    code after the optimizer stepped in step ``k``. ``fc3_lr``: fc3's parameter group's learning rate, times ``lr``."""
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
    head = [p for n, p in model.named_parameters() if n.startswith("fc3.")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("fc3.")]
    if is_torch:
        opt = torch.optim.SGD([{"params": rest}, {"params": head, "lr": lr * fc3_lr}], lr=lr)
    else:  # paddle: a group's learning rate scales the optimizer's
        opt = paddle.optimizer.SGD(lr, parameters=[{"params": rest}, {"params": head, "learning_rate": fc3_lr}])
    with nbdiff.record(model, path, **options) as rec:
        for k in range(steps):
            x = torch.tensor(X) if is_torch else paddle.to_tensor(X)
            model(x).mean().backward()
            opt.step()
            opt.zero_grad() if is_torch else opt.clear_grad()
            if after_update is not None:
                after_update(k, model)
    return rec.path


def first_step_tensor(path):
    from nbdiff.trace.dump.store import read_dump

    dump = read_dump(path)
    return dump, np.asarray(dump.steps[0][1].outputs[0].value)


def small_events():
    """One forward event with a NaN and an Inf, values and a stack: the dump-format tests' step."""
    from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
    from nbdiff.trace.origin.stack import Frame

    x = np.array([[1.0, np.nan], [np.inf, -2.0]], "float32")
    return [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "fc", "Linear", 0, 1, None, True, (TensorRecord("in[0]", (2, 2), "float32", x),),
              (TensorRecord("out", (2, 2), "float32", x * 2),), args=("bias=True",), stack=(Frame("/u/m.py", 3, "forward"),)),
    ]  # fmt: skip


def momentum_pair(bug_in):
    """The fault suite's CNN in torch and paddle, train mode; ``bug_in``: the side whose BatchNorms got
    the other framework's meaning of momentum (paddle keeps ``momentum`` of the old value, torch ``1 - m``)."""
    import paddle
    import torch

    torch.manual_seed(0)
    paddle.seed(0)
    t, p = BUILDERS["cnn"]("torch"), BUILDERS["cnn"]("paddle")
    for bn in (t.bn1, t.bn2):
        bn.momentum = 0.9 if bug_in == "torch" else 0.1
    for bn in (p.bn1, p.bn2):
        bn._momentum = 0.1 if bug_in == "paddle" else 0.9
    return t, p


CNN_X = 10 * np.random.RandomState(1).randn(4, 3, 8, 8).astype("float32")
"""Large inputs: a batch variance far above the running one, so the biased/unbiased difference (1/256 of
it) is over the tolerance at every step on any machine, not only where the draw makes it so."""


def record_training(model, folder, dump_type, steps=3):
    """The user's train-mode SGD loop on a CNN, recorded."""
    import paddle
    import torch

    x = CNN_X
    model.train()
    # A conv bias before a BatchNorm has a gradient of rounding noise alone, which a statistics dump cannot
    # tell from a port's difference (a known gap, see the note): those biases are not trained here.
    params = [p for n, p in model.named_parameters() if not (n.startswith("conv") and n.endswith("bias"))]
    if isinstance(model, torch.nn.Module):
        opt, tensor, clear = torch.optim.SGD(params, lr=0.05), torch.tensor, "zero_grad"
    else:
        opt, tensor, clear = paddle.optimizer.SGD(0.05, parameters=params), paddle.to_tensor, "clear_grad"
    with nbdiff.record(model, folder, dump_type=dump_type) as rec:
        for _ in range(steps):
            model(tensor(x)).pow(2).mean().backward()
            opt.step()
            getattr(opt, clear)()
    return rec.path
