"""One step of one model: the default loss."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402


class _TorchTwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.g = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return {"a": self.fc(x), "b": self.g(x)}


class _PaddleTwoHeads(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc, self.g = paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 2)

    def forward(self, x):
        a, b = self.fc(x), self.g(x)
        return {"b": b, "a": a}  # the same keys, in another order


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_dict_outputs_in_another_key_order_have_the_same_default_loss(direction):
    base, raw = (_TorchTwoHeads(), _PaddleTwoHeads())
    if direction == "paddle->torch":
        base, raw = raw, base
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(3, 4).astype("float32"))
    assert result, result.report()  # was: a divergence at <loss>
