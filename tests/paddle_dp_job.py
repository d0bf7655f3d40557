"""A paddle data-parallel training job as users write it, for tests/test_data_parallel.py.

``python tests/paddle_dp_job.py OUT [BUG_RANK]`` trains the fault suite's paddle MLP (its weights
the torch one's, ``torch.manual_seed(0)``) with ``paddle.DataParallel`` over 2 CPU processes
(``paddle.distributed.spawn``, gloo): each rank on its half of the batch, the gradients averaged
by DataParallel. Rank ``BUG_RANK``'s activation is ReLU, not GELU. Two SGD steps, recorded with
``nbdiff.record(model, OUT, mesh={"dp": 2})``.
"""

from __future__ import annotations

import sys


def train(out: str, bug_rank: int) -> None:
    import paddle
    import paddle.distributed as dist
    import torch

    import nbdiff
    from tests.dumps import X, pair

    dist.init_parallel_env()
    rank = dist.get_rank()
    torch.manual_seed(0)
    _, model = pair(bug="act" if rank == bug_rank else None)
    parallel = paddle.DataParallel(model)
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    half = paddle.to_tensor(X[4 * rank : 4 * rank + 4])
    with nbdiff.record(model, out, mesh={"dp": 2}):
        for _ in range(2):
            parallel(half).mean().backward()
            opt.step()
            opt.clear_grad()


if __name__ == "__main__":
    import paddle.distributed as dist

    dist.spawn(train, args=(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1), nprocs=2, backend="gloo")
