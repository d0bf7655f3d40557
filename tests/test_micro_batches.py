"""A step of micro-batches (gradient accumulation) compared with a step on the whole batch
(gather/micro_batches): in one process, torch and its paddle port, both ways of scaling the loss."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from tests.dumps import X, pair  # noqa: E402

M = 4


def _accumulated(model, path, reduce: str, bug_micro: int = -1, bug_step: int = 1):
    """Two SGD steps, each over ``M`` micro-batches of ``X``: ``reduce="sum"`` divides each loss by
    ``M`` (the losses add up to the batch's mean); ``"mean"`` backpropagates each micro-batch's own
    mean and divides the gradients after, as torch's pipeline schedules do. ``bug_micro``: from
    ``bug_step`` on, fc2's output is scaled by 1.01 on that micro-batch."""
    import paddle
    import torch

    is_torch = isinstance(model, torch.nn.Module)
    inner, seen = model.fc2.forward, {"n": 0}

    def fc2(x):
        out = inner(x)
        k, mb = divmod(seen["n"], M)
        seen["n"] += 1
        return out * 1.01 if k >= bug_step and mb == bug_micro else out

    model.fc2.forward = fc2
    opt = (torch.optim.SGD if is_torch else lambda params, lr: paddle.optimizer.SGD(lr, parameters=params))(
        list(model.parameters()), lr=0.1
    )
    with nbdiff.record(model, path, micro_batches=M, micro_batch_reduce=reduce):
        for _ in range(2):
            for part in np.split(X, M):
                loss = model(torch.tensor(part) if is_torch else paddle.to_tensor(part)).mean()
                (loss / M if reduce == "sum" else loss).backward()
            if reduce == "mean":
                for p in model.parameters():
                    if is_torch:
                        p.grad /= M
                    else:
                        p.grad.set_value(p.grad / M)
            opt.step()
            opt.zero_grad() if is_torch else opt.clear_grad()
    return path


def _whole(model, path):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbdiff.record(model, path):
        for _ in range(2):
            model(torch.tensor(X)).mean().backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("raw_fw", ["torch", "paddle"])
def test_an_accumulated_step_agrees_with_the_whole_batch_and_a_bug_in_one_micro_batch_is_named(
    tmp_path, reduce, raw_fw
):
    base, raw = pair(base_fw="torch", raw_fw=raw_fw)
    _, twin = pair(base_fw="torch", raw_fw=raw_fw)
    nbdiff.assign_weight(base, twin, inputs=X)
    whole = _whole(base, tmp_path / "whole")
    r = nbdiff.compare(whole, _accumulated(raw, tmp_path / "acc", reduce))
    assert r.aligned, r.report()
    assert r.warnings == (), r.warnings
    d = nbdiff.compare(whole, _accumulated(twin, tmp_path / "bug", reduce, bug_micro=2)).first_divergence
    assert (d.step, d.phase.value, d.raw_path) == (1, "forward", "fc2"), d.describe()
    assert d.shards == "raw rank 0, micro-batch 2 of 4: its slice (shard(0)) differs; micro-batches 0, 1, 3 agree"


def test_the_wrong_reduction_is_a_divergence_of_every_gradient_not_agreement(tmp_path):
    # Said "mean" where the loop divided each loss by M: every gradient is M times too small.
    base, raw = pair(base_fw="torch", raw_fw="torch")
    whole = _whole(base, tmp_path / "whole")
    path = tmp_path / "acc"
    _accumulated(raw, path, "sum")
    import json

    for manifest in path.glob("rank*/manifest.json"):
        data = json.loads(manifest.read_text())
        data["micro_batch_reduce"] = "mean"
        manifest.write_text(json.dumps(data))
    d = nbdiff.compare(whole, path).first_divergence
    assert (d.step, d.phase.value) == (0, "backward"), d.describe()


def test_micro_batches_that_cannot_be_are_an_option_error(tmp_path):
    import torch

    model = torch.nn.Linear(2, 2)
    for bad, match in [(0, "micro_batches=0"), (2.0, "micro_batches=2.0"), (True, "micro_batches=True")]:
        with pytest.raises(OptionError, match=match):
            nbdiff.record(model, tmp_path, micro_batches=bad)
    with pytest.raises(OptionError, match="micro_batch_reduce='avg'"):
        nbdiff.record(model, tmp_path, micro_batches=2, micro_batch_reduce="avg")
