"""The seed documents' example models (ppautodiff/PaDiff tutorials), made concrete, plus a bugged variant."""

from __future__ import annotations

import numpy as np


def simple_layer(bug: str | None = None):
    """Paddle: x -> linear1 -> relu -> + x -> linear2 (the tutorial's SimpleLayer)."""
    import paddle

    class SimpleLayer(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.linear1 = paddle.nn.Linear(100, 100)
            self.linear2 = paddle.nn.Linear(100, 10)
            self.act = paddle.nn.Sigmoid() if bug == "act" else paddle.nn.ReLU()

        def forward(self, x):
            resdual = x
            x = self.linear1(x)
            x = self.act(x)
            x = x + resdual
            return self.linear2(x)

    return SimpleLayer()


def simple_module():
    """Torch: the same network (SimpleModule); its input is called ``y`` as in PaDiff's 0.2 example."""
    import torch

    class SimpleModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear1 = torch.nn.Linear(100, 100)
            self.linear2 = torch.nn.Linear(100, 10)
            self.act = torch.nn.ReLU()

        def forward(self, y):
            resdual = y
            y = self.linear1(y)
            y = self.act(y)
            y = y + resdual
            return self.linear2(y)

    return SimpleModule()


def inp() -> np.ndarray:
    return np.random.RandomState(0).rand(100, 100).astype("float32")
