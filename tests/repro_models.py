"""Module-level models for the repro tests: a script can import their classes (a backward-only bug)."""

import paddle
import torch


class TorchTanh(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x)


class _ScaledGradTanh(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        y = paddle.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensor()
        return grad * (1 - y * y) * 1.1  # the bug: forward agrees, the gradient does not


class PaddleTanh(paddle.nn.Layer):
    def __init__(self, bug=True):
        super().__init__()
        self.bug = bug

    def forward(self, x):
        return _ScaledGradTanh.apply(x) if self.bug else paddle.tanh(x)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 8), TorchTanh(), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = paddle.nn.Linear(8, 8), PaddleTanh(), paddle.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


ODD_NAME = "norm\\Nx\\x00"  # a ModuleDict key can hold backslashes: in a docstring they were a SyntaxError


class TorchOddNames(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.add_module(ODD_NAME, torch.nn.LayerNorm(8))

    def forward(self, x):
        return getattr(self, ODD_NAME)(self.fc(x))


class PaddleOddNames(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)
        self.add_sublayer(ODD_NAME, paddle.nn.LayerNorm(8, epsilon=1e-3))

    def forward(self, x):
        return getattr(self, ODD_NAME)(self.fc(x))
