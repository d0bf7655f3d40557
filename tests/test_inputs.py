"""The user's inputs: pairs, single arrays, and clear errors for wrong forms."""

import numpy as np
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


def test_a_tensor_passed_as_the_model_is_named_as_such():
    # Was AttributeError: 'Tensor' object has no attribute 'named_sublayers'.
    tb, _ = _models()
    with pytest.raises(InputError, match="raw is a paddle Tensor, not a model"):
        nbdiff.auto_diff(tb, paddle.to_tensor(inputs("mlp")), inputs("mlp"))
    with pytest.raises(InputError, match="base is a torch Tensor, not a model"):
        nbdiff.watch(torch.ones(2), BUILDERS["mlp"]("paddle"))


def test_a_generator_forward_is_not_a_silent_success():
    class Gen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            yield self.fc(x)

    with pytest.raises(InputError, match="nothing was compared: Gen's call ran no layer.*generator"):
        nbdiff.auto_diff(Gen(), Gen(), inputs("mlp"), diff_phase="forward")


@pytest.mark.parametrize("side", ["base", "raw"])
def test_an_empty_batch_says_so_and_does_not_blame_the_model(side):
    # It failed inside nbdiff's own hook (paddle: "cannot reshape tensor of 0 elements"), blamed on the model.
    x = np.random.RandomState(0).randn(4, 16).astype("float32")
    empty = np.zeros((0, 16), "float32")
    pair = (empty, x) if side == "base" else (x, empty)
    with pytest.raises(InputError, match=rf"the {side} inputs hold no values \(every tensor is empty: \(0, 16\)\)"):
        nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), pair)


def test_numpy_inputs_go_to_the_device_of_each_models_weights():
    # A CUDA model was handed host tensors made from the numpy input (its first Linear raised).
    from nbdiff.frameworks import framework_of
    from nbdiff.trace.inputs import split_inputs

    base, raw = _models()
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    placed = []

    class Placing(type(bfw)):
        def device_of(self, obj):
            return "device of base" if obj is base else None

        def from_numpy(self, array, requires_grad=False, device=None):
            placed.append(device)
            return super().from_numpy(array, requires_grad)

    split_inputs(inputs("mlp"), Placing(), rfw, (base, raw))
    assert placed == ["device of base"]


def test_a_model_on_the_host_is_given_host_tensors():
    from nbdiff.frameworks import framework_of

    base, raw = _models()
    for model in (base, raw):
        fw = framework_of(model, "model")
        assert fw.device_of(model) is None
        assert fw.device_of(next(iter(model.parameters()))) is None
