"""A port whose forward is written on lines longer than any panel: its source must read whole."""

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
