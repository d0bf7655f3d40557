"""The unpaired calls named where a layer's own code is blamed, both directions."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")


class _TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _Clip(paddle.nn.Layer):
    """A port's own activation layer where the original calls relu in its code; clips at 0.1 (the bug)."""

    def forward(self, x):
        return paddle.clip(x, min=0.1)


class _PaddleMLP(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1, self.clip, self.fc2 = paddle.nn.Linear(8, 16), _Clip(), paddle.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.clip(self.fc1(x)))


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_an_error_in_unpaired_calls_is_blamed_on_them_by_name(direction, tmp_path):
    base, raw = (_TorchMLP(), _PaddleMLP()) if direction == "torch->paddle" else (_PaddleMLP(), _TorchMLP())
    side = "raw" if direction == "torch->paddle" else "base"
    result = nbdiff.auto_diff(base, raw, X)
    d = result.first_divergence
    assert d.where == "between" and d.between == ("fc1", "fc2"), result.report()
    assert d.unpaired == (f"{side} `clip` (_Clip)",)
    assert "unpaired calls" in d.describe() and not d.inherited
    assert nbdiff.load(result.save(str(tmp_path / "r"))).first_divergence.unpaired == d.unpaired
