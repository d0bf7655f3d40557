"""Quickstart: a torch model against its paddle port, first faithful, then with a bug."""

import warnings

import numpy as np
import paddle
import torch

import nbdiff

warnings.filterwarnings("ignore", message="No ccache found")


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.nn.GELU()  # defined first here, last in the port: nbdiff does not care
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.norm(self.act(self.fc1(x))))


class PaddleNet(paddle.nn.Layer):
    def __init__(self, epsilon=1e-5):
        super().__init__()
        self.fc1 = paddle.nn.Linear(16, 32)
        self.norm = paddle.nn.LayerNorm(32, epsilon=epsilon)
        self.fc2 = paddle.nn.Linear(32, 4)
        self.act = paddle.nn.GELU()

    def forward(self, x):
        return self.fc2(self.norm(self.act(self.fc1(x))))


x = np.random.RandomState(0).randn(8, 16).astype("float32")

print("== faithful port ==")
result = nbdiff.auto_diff(TorchNet(), PaddleNet(), x)
print(result.report())

print("\n== port with a LayerNorm epsilon of 1e-3 ==")
result = nbdiff.auto_diff(TorchNet(), PaddleNet(epsilon=1e-3), x)
print(result.report())
print("\nblamed:", result.first_divergence.describe())
