"""A pipeline-parallel training job as users write it, for tests/test_pipeline.py.

``python tests/pp_job.py OUT`` trains the model in one process on the whole batch;
``torchrun --nproc_per_node 2 tests/pp_job.py OUT --pp gpipe`` (or ``1f1b``) trains it with torch's
own ``torch.distributed.pipelining``: two stages, the model split as torchtitan splits it (each
stage the same class with the other stage's layers deleted, so layer paths stay the full model's),
the batch in 4 micro-batches. ``--tp``: 4 ranks, a ``(2, 2)`` mesh named ``("pp", "tp")``, each
stage's block tensor-parallel (``up`` column-, ``down`` row-parallel). ``--bug-rank R --bug-micro M
--bug-step K``: from step K on, rank R's activation computes something else on micro-batch M.
Two SGD steps, recorded with ``nbdiff.record(..., micro_batches=4)``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import nbdiff

MICRO = 4


class Act(nn.Module):
    """A custom activation; with a bug, one rank's micro-batch of it is scaled from some step on.
    The loop tells it the step and counts its calls from each step's start (the schedule's first
    step also runs each stage once on empty tensors, to learn their shapes)."""

    def __init__(self, bug: tuple[int, int, int] | None) -> None:
        super().__init__()
        self.bug, self.step, self.calls = bug, 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.gelu(x)
        rank = dist.get_rank() if dist.is_initialized() else -1
        if self.bug is not None and rank == self.bug[0] and self.step >= self.bug[2] and self.calls == self.bug[1]:
            y = y * 1.01
        self.calls += 1
        return y


class Block(nn.Module):
    def __init__(self, bug: tuple[int, int, int] | None = None) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(16, 32), Act(bug), nn.Linear(32, 16)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(self.act(self.up(h)))


class Model(nn.Module):
    def __init__(self, bug: tuple[int, int, int] | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.layers = nn.ModuleDict({str(i): Block(bug) for i in range(2)})
        self.head = nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens) if self.emb is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        return self.head(h) if self.head is not None else h


def _stage(model: Model, stage: int) -> Model:
    """Stage ``stage`` of 2: block ``stage`` and the embedding (stage 0) or the head (stage 1)."""
    del model.layers[str(1 - stage)]
    if stage == 0:
        model.head = None
    else:
        model.emb = None
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pp", choices=["gpipe", "1f1b"], help="pipeline schedule (under torchrun, 2 ranks)")
    ap.add_argument("--tp", action="store_true", help="4 ranks: each stage tensor-parallel over 2")
    ap.add_argument("--bug-rank", type=int, default=-1)
    ap.add_argument("--bug-micro", type=int, default=0)
    ap.add_argument("--bug-step", type=int, default=0)
    ap.add_argument("--dump-type", default="tensor", help="record's dump_type")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Model((args.bug_rank, args.bug_micro, args.bug_step) if args.bug_rank >= 0 else None)
    tokens = torch.randint(0, 32, (8, 5), generator=torch.Generator().manual_seed(1))
    loss_fn = lambda out, _: out.square().mean()  # noqa: E731
    if args.pp is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with nbdiff.record(model, args.out, dump_type=args.dump_type):
            for _ in range(2):
                loss_fn(model(tokens), None).backward()
                opt.step()
                opt.zero_grad()
        return
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    dist.init_process_group("gloo")
    mesh, group = {"pp": 2}, None
    rank = dist.get_rank()
    if args.tp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
        rank, group = mesh.get_coordinate()[0], mesh["pp"].get_group()
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        parallelize_module(model.layers[str(rank)], mesh["tp"], plan)
    model = _stage(model, rank)
    stage = PipelineStage(model, rank, 2, torch.device("cpu"), group=group)
    schedule = (ScheduleGPipe if args.pp == "gpipe" else Schedule1F1B)(stage, MICRO, loss_fn=loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbdiff.record(model, args.out, dump_type=args.dump_type, mesh=mesh, micro_batches=MICRO):
        for step in range(2):
            for act in (m for m in model.modules() if isinstance(m, Act)):
                act.step, act.calls = step, 0
            if rank == 0:  # the stage
                schedule.step(tokens)
            else:
                schedule.step(target=torch.zeros(8))
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/tp_job.py: torch's gloo teardown aborts now and then


if __name__ == "__main__":
    main()
