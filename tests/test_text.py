"""The text report (``result.report()``)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402


class _Wrap(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act = torch.nn.Linear(4, 4), torch.nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(x))


class _Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = _Wrap(), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x))


class _Flat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.head = torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.act(self.fc(x)) * 1.01)  # a bug: the report then draws its tree


def test_the_tree_indents_rows_under_the_rows_shown_not_under_an_unpaired_container():
    # base's `block` has no counterpart in raw: its row is left out, and its sublayers were indented
    # one level too deep, under nothing.
    torch.manual_seed(0)
    result = nbdiff.auto_diff(_Nested(), _Flat(), np.ones((2, 4), "float32"))
    tree = result.report().split("Tree (step 0, forward):\n")[1].split("\n\n")[0].splitlines()
    rows = {line.strip().split(" ")[0]: len(line) - len(line.lstrip()) for line in tree}
    assert "block" not in rows, tree
    assert rows["block.fc"] == rows["block.act"] == rows["head"] == rows["<root>"] + 2, tree
