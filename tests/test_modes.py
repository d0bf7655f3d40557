"""Temporary model changes are always undone: flags, dropout, running statistics."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.modes import eval_mode, kept_state, no_dropout, restore_state, save_state  # noqa: E402


def _model(fw_name):
    if fw_name == "torch":
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.3))
    return paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.BatchNorm1D(4), paddle.nn.Dropout(0.3))


def _x(fw_name):
    a = np.random.RandomState(0).randn(6, 4).astype("float32")
    return torch.tensor(a) if fw_name == "torch" else paddle.to_tensor(a)


def _stats(model):
    bn = model[1]
    return (bn.running_mean if hasattr(bn, "running_mean") else bn._mean).numpy().copy()


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_kept_state_restores_running_statistics_even_on_error(fw_name):
    model = _model(fw_name)
    before = _stats(model)
    with pytest.raises(RuntimeError), kept_state(framework_of(model, "m"), model):
        model(_x(fw_name))
        assert not np.allclose(_stats(model), before)
        raise RuntimeError("user code failed")
    np.testing.assert_array_equal(_stats(model), before)


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_eval_mode_and_no_dropout_restore_flags_and_probabilities(fw_name):
    model = _model(fw_name)
    model[0].eval()  # a mixed state must come back exactly
    fw = framework_of(model, "m")
    with no_dropout(fw, model), eval_mode(fw, model):
        assert not model[1].training and model[2].p == 0.0
    assert model.training and not model[0].training and model[1].training
    assert model[2].p == 0.3


def test_save_state_skips_paddle_rnn_dropout_state():
    lstm = paddle.nn.LSTM(4, 5)
    fw = framework_of(lstm, "m")
    restore_state(fw, save_state(fw, lstm))  # used to fail: shape () reads back as (0,)


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_dropout_in_eval_mode_is_left_alone(fw_name):
    # Zeroing p in eval also removed paddle's downscale_in_infer scaling, hiding a real difference.
    model = _model(fw_name)
    model.eval()
    fw = framework_of(model, "m")
    with no_dropout(fw, model):
        assert model[2].p == 0.3
