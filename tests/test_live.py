import numpy as np
import paddle
import pytest
import torch

from nbdiff.engine.live.comparer import LiveComparer, held_param_grads, live_param_grads
from nbdiff.engine.stepping import run_step
from nbdiff.frameworks import framework_of
from nbdiff.judge.tolerance import resolve_tolerance
from nbdiff.trace.inputs import split_inputs


def _two_steps():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    raw = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    raw.load_state_dict(base.state_dict())
    fw = framework_of(base, "base")
    x = np.random.RandomState(0).randn(5, 4).astype("float32")
    bcall, rcall = split_inputs(x, fw, fw)
    brec = run_step(fw, base, bcall, None, side="base", step=0, backward=True)
    rrec = run_step(fw, raw, rcall, None, side="raw", step=0, backward=True)
    cmp = LiveComparer(fw, base, fw, raw, lambda a, b: resolve_tolerance(None, None, a, b), "strict")
    pairing, _ = cmp.pair(brec, rrec)
    return base, raw, brec, rrec, cmp, pairing


def test_parameter_gradients_are_compared_from_the_recorded_copies():
    # The step's records hold a copy of every parameter gradient; comparing them needs no
    # second read (and copy) of the live gradients, which may have changed since.
    base, raw, brec, rrec, cmp, pairing = _two_steps()
    assert {id(p) for p in raw.parameters()} <= set(rrec.param_grads)
    with torch.no_grad():
        raw[2].weight.grad.mul_(3.0)  # after the step: not what the step computed
    assert _weight_grad_diff(cmp.compare(pairing, brec, rrec).diffs).passed
    assert not _weight_grad_diff(cmp.compare(pairing, brec, rrec, grads=live_param_grads).diffs).passed


def _weight_grad_diff(diffs):
    # One plan covers the whole same-framework model: its parameter gradients are on the root's event.
    return next(t for d in diffs if d.base.phase.value == "backward" for t in d.tensors if t.name == "2.weight")


def test_held_gradients_fall_back_to_live_ones_only_when_asked():
    base, _, brec, _, cmp, _ = _two_steps()
    fw = cmp.bfw
    recorded = held_param_grads(brec.param_grads)(fw, base[0], False)
    assert set(recorded) == {"weight", "bias"}
    assert recorded["weight"] is brec.param_grads[id(base[0].weight)]
    np.testing.assert_array_equal(recorded["weight"], base[0].weight.grad.numpy())
    live = held_param_grads({})(fw, base[0], False)
    assert live.keys() == {"weight", "bias"}
    # Read live, they are copies: comparisons keep them for their deferred metrics, and a framework
    # may zero a gradient in place later (paddle's clear_grad). live_param_grads hands views.
    assert not np.shares_memory(live["weight"], base[0].weight.grad.numpy())
    assert np.shares_memory(live_param_grads(fw, base[0], False)["weight"], base[0].weight.grad.numpy())
    assert held_param_grads({}, live=False)(fw, base[0], False) == {}


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_nan_weight_is_blamed_where_it_produces_nan_not_on_the_activation_after_it(direction):
    # The NaN is copied into both sides, so fc1's outputs agree (NaN for NaN); torch's ReLU passes NaN
    # on and paddle's gives 0, so the ReLU was blamed and fc1 read as ok.
    import nbdiff
    from tests.structure_models import put_nan

    def net(fw):
        if fw == "torch":
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))

    bfw, rfw = direction.split("->")
    base, raw = net(bfw), net(rfw)
    put_nan(base[0].weight)
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(3, 4).astype("float32"))
    d = result.first_divergence
    assert (d.where, d.base_path) == ("nonfinite", "0"), result.report()


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_nan_made_by_a_custom_backward_is_named_as_its_source(direction):
    # Blamed as the layer's backward error, with no word that it makes NaN from finite gradients.
    import nbdiff
    from tests.structure_models import backward_function

    def net(fw, bad):
        nn = torch.nn if fw == "torch" else paddle.nn

        class Mid(nn.Module if fw == "torch" else nn.Layer):
            def forward(self, x):
                return backward_function(fw, lambda g: g * float("nan")).apply(x) if bad else x * 1.0

        return nn.Sequential(nn.Linear(4, 8), Mid(), nn.Tanh(), nn.Linear(8, 2))

    bfw, rfw = direction.split("->")
    result = nbdiff.auto_diff(net(bfw, False), net(rfw, True), np.random.RandomState(0).randn(3, 4).astype("float32"))
    d = result.first_divergence
    assert (d.phase.value, d.where, d.raw_path) == ("backward", "nonfinite", "1"), result.report()
    assert "produces NaN/Inf from finite gradients" in d.describe()
