"""The user's inputs: pairs, single arrays, and clear errors for wrong forms."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import InputError  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _models():
    return BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")


def test_swapped_inputs_are_named_as_such():
    # Was paddle's "must be Tensor, but got Tensor".
    tb, pb = _models()
    x = inputs("mlp")
    with pytest.raises(InputError, match="base inputs hold a paddle tensor.*swapped"):
        nbdiff.auto_diff(tb, pb, (paddle.to_tensor(x), torch.tensor(x)))
    assert nbdiff.auto_diff(tb, pb, (torch.tensor(x), paddle.to_tensor(x)))
