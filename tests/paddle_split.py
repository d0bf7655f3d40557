"""A torch model and its paddle port split by hand over two tensor-parallel ranks, as a port holds
it where fleet's parallel layers cannot start (no accelerator here). For tests/test_gathered.py
and tests/test_data_parallel.py."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import nbdiff

__all__ = ["TorchWhole", "paddle_ranks", "record_torch_whole", "recorded_as_ranks"]


@contextlib.contextmanager
def recorded_as_ranks(models: list, out: Path, **options) -> Iterator[None]:
    """Each of ``models`` recorded into ``out`` as one rank of a job of ``len(models)`` ranks, all in
    this process (``RANK`` and ``WORLD_SIZE`` set as torchrun sets them, while each recording begins)."""
    os.environ["WORLD_SIZE"] = str(len(models))
    try:
        with contextlib.ExitStack() as stack:
            for rank, m in enumerate(models):
                os.environ["RANK"] = str(rank)
                stack.enter_context(nbdiff.record(m, out, **options))
            yield
    finally:
        os.environ.pop("RANK", None)
        os.environ.pop("WORLD_SIZE", None)


def _torch_whole():
    torch.manual_seed(0)
    return torch.nn.ModuleDict(
        {"up": torch.nn.Linear(8, 16), "down": torch.nn.Linear(16, 8, bias=False), "head": torch.nn.Linear(8, 4)}
    )


class TorchWhole(torch.nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        m = _torch_whole()
        self.up, self.act, self.down, self.head = m["up"], torch.nn.GELU(), m["down"], m["head"]

    def forward(self, x):
        return self.head(x + self.down(self.act(self.up(x))))


def paddle_ranks(whole: TorchWhole, bug_rank: int = -1, dp_index: int = 0) -> list:
    """Rank r holds columns r of ``up`` and rows r of ``down`` (paddle lays weights [in, out]), so
    ``down``'s output is a partial sum; the block all-reduces it (every rank gets the same sum, and
    its gradient back whole, as a real all-reduce does). ``dp_index``: the data-parallel group, whose
    rank ``r`` is the job's rank ``2 * dp_index + r`` (``bug_rank`` is the job's)."""
    paddle = pytest.importorskip("paddle")

    class AllReduce(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, own, total):
            return total.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Act(paddle.nn.Layer):
        def __init__(self, bug: bool) -> None:
            super().__init__()
            self.bug = bug

        def forward(self, x):
            return paddle.nn.functional.gelu(x) * (1.01 if self.bug else 1.0)

    class Rank(paddle.nn.Layer):
        def __init__(self, r: int) -> None:
            super().__init__()
            cols = slice(8 * r, 8 * (r + 1))
            self.up, self.act = paddle.nn.Linear(8, 8), Act(2 * dp_index + r == bug_rank)
            self.down, self.head = paddle.nn.Linear(8, 8, bias_attr=False), paddle.nn.Linear(8, 4)
            t = lambda x: x.detach().numpy()  # noqa: E731
            self.up.weight.set_value(t(whole.up.weight)[cols].T)
            self.up.bias.set_value(t(whole.up.bias)[cols])
            self.down.weight.set_value(t(whole.down.weight)[:, cols].T)
            self.head.weight.set_value(t(whole.head.weight).T)
            self.head.bias.set_value(t(whole.head.bias))
            self.total = None

        def partial(self, x):
            """This rank's part of the all-reduce, without calling (or recording) its layers."""
            with paddle.no_grad():
                h = paddle.nn.functional.gelu(paddle.matmul(x, self.up.weight) + self.up.bias)
                return paddle.matmul(h * (1.01 if self.act.bug else 1.0), self.down.weight)

        def forward(self, x):
            return self.head(x + AllReduce.apply(self.down(self.act(self.up(x))), self.total))

    return [Rank(0), Rank(1)]


def record_torch_whole(out: Path, whole: TorchWhole) -> Path:
    opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((4, 8)).astype("float32"))
    with nbdiff.record(whole, out):
        for _ in range(2):
            whole(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return out
