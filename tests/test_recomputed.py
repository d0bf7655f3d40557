"""A BatchNorm recomputed from its recorded call: base's layer run on other inputs, forward and backward."""

from dataclasses import replace

import numpy as np
import pytest

from nbdiff.engine.recorded.recomputed import batch_norm_of, rounding_move
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

RNG = np.random.RandomState(0)
X, OTHER, GRAD = (RNG.randn(4, 3, 2, 2).astype("float32") for _ in range(3))


def _event(x: np.ndarray, y: np.ndarray) -> Event:
    rec = lambda name, v: TensorRecord(name, v.shape, "float32", v)  # noqa: E731
    return Event(
        0, Phase.FORWARD, Kind.LAYER, 0, "bn", "BatchNorm2d", 0, 1, None, True, (rec("in[0]", x),), (rec("out", y),)
    )


def _torch_bn(train: bool):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.5, 2.0)
    return bn.train(train)


def _torch_run(bn, x, grad):
    t = torch.tensor(x, requires_grad=True)
    y = bn(t)
    y.backward(torch.tensor(grad))
    return y.detach().numpy(), t.grad.numpy()


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_a_torch_batchnorm_is_read_off_its_call_and_rerun_on_other_inputs(train):
    bn = _torch_bn(train)
    y, _ = _torch_run(bn, X, GRAD)
    call = batch_norm_of(_event(X, y), 1e-5, train=train)
    assert call is not None and call.train is train
    y_other, grad_other = _torch_run(bn, OTHER, GRAD)
    np.testing.assert_allclose(call.forward(OTHER), y_other, atol=1e-5)
    np.testing.assert_allclose(call.backward(OTHER, GRAD), grad_other, atol=1e-5)


def test_a_channels_last_paddle_batchnorm_is_read_off_its_call():
    paddle.seed(0)
    bn = paddle.nn.BatchNorm2D(3, data_format="NHWC")
    bn.weight.set_value(np.array([0.5, 1.5, 2.0], "float32"))
    bn.train()
    last = lambda v: np.ascontiguousarray(v.transpose(0, 2, 3, 1))  # noqa: E731
    y = bn(paddle.to_tensor(last(X))).numpy()
    call = batch_norm_of(_event(last(X), y), 1e-5, channels_last=True, train=True)
    t = paddle.to_tensor(last(OTHER), stop_gradient=False)
    out = bn(t)
    out.backward(paddle.to_tensor(last(GRAD)))
    np.testing.assert_allclose(call.forward(last(OTHER)), out.numpy(), atol=1e-5)
    np.testing.assert_allclose(call.backward(last(OTHER), last(GRAD)), t.grad.numpy(), atol=1e-5)


def test_nothing_is_read_off_a_call_kept_as_statistics_or_of_another_kind():
    y, _ = _torch_run(_torch_bn(True), X, GRAD)
    kept = _event(X, y)
    stats_only = replace(kept, inputs=(TensorRecord("in[0]", X.shape, "float32", None),))
    assert batch_norm_of(stats_only, 1e-5) is None
    assert batch_norm_of(_event(X, np.tanh(X) ** 3), 1e-5) is None  # neither mode fits a cube of tanh


def test_within_one_call_both_modes_fit_so_the_mode_recorded_decides():
    bn = _torch_bn(False)
    y, _ = _torch_run(bn, X, GRAD)
    assert batch_norm_of(_event(X, y), 1e-5).train  # unknown: train mode
    eval_call = batch_norm_of(_event(X, y), 1e-5, train=False)
    np.testing.assert_allclose(eval_call.forward(OTHER), _torch_run(bn, OTHER, GRAD)[0], atol=1e-5)


def test_few_values_of_tiny_spread_move_far_from_rounding():
    call = batch_norm_of(_event(X, _torch_run(_torch_bn(True), X, GRAD)[0]), 1e-5)
    spread = 100 + 1e-3 * RNG.randn(2, 3, 1, 1).astype("float32")  # batch 2 at 1x1: two values per channel
    many = RNG.randn(64, 3, 4, 4).astype("float32")
    assert rounding_move(call.forward, spread) > 100 * rounding_move(call.forward, many)
