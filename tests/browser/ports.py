"""Ports the view's browser tests draw: lines longer than any panel (their source must read whole), and
scores masked with a value that is or is not a mask."""

import paddle
import torch

# fmt: off


class TorchLong(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 4)

    def forward(self, x):
        hidden_states_after_the_first_projection_of_the_inputs = self.fc(x) + 0.0 * x.sum(dim=-1, keepdim=True) + 0.0 * x.mean(dim=-1, keepdim=True)  # noqa: E501
        return self.out(hidden_states_after_the_first_projection_of_the_inputs)  # the end of this line, well past the panel's edge: END_OF_LINE


class PaddleLong(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)
        self.out = paddle.nn.Linear(4, 4)

    def forward(self, x):
        hidden_states_after_the_first_projection_of_the_inputs = self.fc(x) * 1.01 + 0.0 * x.sum(axis=-1, keepdim=True) + 0.0 * x.mean(axis=-1, keepdim=True)  # noqa: E501
        return self.out(hidden_states_after_the_first_projection_of_the_inputs)  # the end of this line, well past the panel's edge: END_OF_LINE


# fmt: on


class Masked(torch.nn.Module):
    """Causal scores filled with ``fill`` where masked (``-inf``, ``-1e9``: a mask; ``-1e3``: a value)."""

    def __init__(self, fill):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.o = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.fill = fill

    def forward(self, x):
        s = self.q(x) @ x.transpose(-1, -2)
        s = s.masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), self.fill)
        return self.o(torch.softmax(s, -1) @ x)
