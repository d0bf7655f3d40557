"""Optimizer updates given gradients that differ: what the gradients explain is not a divergence."""

import numpy as np
import pytest

from nbdiff.engine.training.updates import GradientSpread, discount_updates, update_tolerance
from nbdiff.judge.metrics import compare_tensors
from nbdiff.judge.tolerance import resolve_tolerance

LR, EPS = 1e-2, 1e-8


def _adam_first_step(g):
    return -LR * g / (np.abs(g) + EPS)  # bias-corrected m / sqrt(v) at step 0


def _gradients(noise_at_zero=True):
    rng = np.random.RandomState(0)
    base = rng.randn(16, 8).astype(np.float32) * 1e-2
    raw = base * (1 + rng.randn(16, 8).astype(np.float32) * 1e-7)  # rounding-level difference
    if noise_at_zero:  # a gradient that is 0 but for rounding, of opposite sign in the two frameworks
        base[3, 5], raw[3, 5] = 1e-7, -1e-7  # within 2e-5 of max|g|
    return base, raw


def discount_gradients(t, bu, ru, steps, mode):
    """``t`` redone with the gradients of ``steps`` (base's, raw's per step) folded into a spread."""
    spread = GradientSpread()
    for bg, rg in steps:
        spread.fold({"fc": ({t.name: bg}, {t.name: rg})})
    (redone,) = discount_updates([t], {t.name: bu}, {t.name: ru}, spread.of("fc"), mode)
    return redone


def _compare(bu, ru):
    tol = update_tolerance(lambda a, b: resolve_tolerance(None, None, a, b), "float32", "float32", 1.0)
    return compare_tensors("weight", ru, bu, tol)


def test_an_adam_update_of_a_gradient_at_rounding_noise_is_explained_by_the_gradients():
    bg, rg = _gradients()
    bu, ru = _adam_first_step(bg), _adam_first_step(rg)
    t = _compare(bu, ru)
    assert not t.passed and t.max_abs > LR  # the sign flip moves the element by 2 lr
    redone = discount_gradients(t, bu, ru, [(bg, rg)], "strict")
    assert redone.passed and redone.note.startswith("1 element(s) differ by what the gradients")


def test_a_wrong_learning_rate_is_not_explained_by_gradients_that_agree():
    bg, rg = _gradients()
    bu, ru = _adam_first_step(bg), 1.01 * _adam_first_step(rg)
    t = _compare(bu, ru)
    assert discount_gradients(t, bu, ru, [(bg, rg)], "strict") is t
    bu, ru = _adam_first_step(bg), 1.01 * _adam_first_step(bg)  # and not without the noisy element
    t = _compare(bu, ru)
    assert discount_gradients(t, bu, ru, [(bg, bg)], "strict") is t


def test_a_gradient_difference_of_an_earlier_step_still_explains_a_later_update():
    bg, rg = _gradients()
    bu, ru = _adam_first_step(bg), _adam_first_step(rg)  # momentum carries step 0 into step 1
    t = _compare(bu, ru)
    assert discount_gradients(t, bu, ru, [(bg, bg)], "strict") is t  # this step's gradients alone: equal
    assert discount_gradients(t, bu, ru, [(bg, rg), (bg, bg)], "strict").passed


def test_gradients_of_another_shape_leave_the_comparison_as_it_was():
    bg, rg = _gradients()
    bu, ru = _adam_first_step(bg), _adam_first_step(rg)
    t = _compare(bu, ru)
    assert discount_gradients(t, bu, ru, [(bg.T, rg.T)], "strict") is t


def test_a_spread_folded_one_step_at_a_time_discounts_as_all_the_steps_together():
    bg, rg = _gradients()
    bu, ru = _adam_first_step(bg), _adam_first_step(rg)
    t = _compare(bu, ru)
    spread = GradientSpread()
    for step in ((bg, rg), (bg, bg)):
        spread.fold({"fc": ({"weight": step[0]}, {"weight": step[1]})})
    (folded,) = discount_updates([t], {"weight": bu}, {"weight": ru}, spread.of("fc"), "strict")
    together = discount_gradients(t, bu, ru, [(bg, rg), (bg, bg)], "strict")
    assert spread.steps == 2 and folded.passed and together.passed and folded.note == together.note
    spread.fold({"fc": ({"weight": bg.T}, {"weight": rg.T})})  # the shapes changed: no discount any more
    assert discount_updates([t], {"weight": bu}, {"weight": ru}, spread.of("fc"), "strict") == [t]


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_parameter_frozen_on_one_side_only_is_its_update_at_step_0(direction):
    # The missing update was never reported: the blame went to step 1's forward.
    paddle = pytest.importorskip("paddle")
    torch = pytest.importorskip("torch")
    import nbdiff

    def net(fw):
        if fw == "torch":
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.Tanh(), paddle.nn.Linear(8, 2))

    def sgd(fw, model):
        if fw == "torch":
            return torch.optim.SGD(model.parameters(), lr=0.1)
        return paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())

    bfw, rfw = direction.split("->")
    base, raw = net(bfw), net(rfw)
    if rfw == "torch":
        raw[0].weight.requires_grad_(False)
    else:
        raw[0].weight.stop_gradient = True
    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    result = nbdiff.auto_diff(base, raw, x, optimizers=[sgd(bfw, base), sgd(rfw, raw)], steps=2)
    d = result.first_divergence
    assert (d.step, d.phase.value, d.parameter) == (0, "optimizer", "0.weight"), result.report()
    assert d.why() == "trainable: base True, raw False"


def test_updates_of_gradients_that_are_noise_on_both_sides_are_explained_whatever_they_are():
    # A long watch of equivalent CNNs with Adam false-alarmed (at step 1, 30, 51, 86 or 143: noise
    # decides): a convolution bias before BatchNorm has gradients of 1e-9, 78% apart, and Adam,
    # dividing by about as little, moved it +2.1e-4 on one side and -1.8e-4 on the other.
    bg = np.array([1.53e-8, 3.9e-9, 7.2e-9, 2.0e-9], np.float32)
    rg = np.array([0.33e-8, -2.4e-9, 0.6e-9, 0.5e-9], np.float32)
    bu = np.array([2.13e-4, -0.4e-4, 1.1e-4, 0.3e-4], np.float32)
    ru = np.array([-1.78e-4, 0.9e-4, -0.2e-4, 0.6e-4], np.float32)
    t = _compare(bu, ru)
    assert not t.passed
    redone = discount_gradients(t, bu, ru, [(bg, rg)], "strict")
    assert redone.passed, redone
    # Where the gradients agree, the same updates stay a divergence.
    assert discount_gradients(t, bu, ru, [(bg, bg * (1 + 1e-6))], "strict") is t
    # A weight element whose gradients were 24% apart, its updates of opposite sign (step 110).
    bg, rg = np.array([1.0e-3, 2.0e-3], np.float32), np.array([0.76e-3, 2.0e-3], np.float32)
    bu, ru = np.array([9.7e-5, 5.3e-4], np.float32), np.array([-1.85e-4, 5.3e-4], np.float32)
    t = _compare(bu, ru)
    assert not t.passed and discount_gradients(t, bu, ru, [(bg, rg)], "strict").passed


def test_an_sgd_update_late_in_a_run_is_allowed_its_own_gradient_difference():
    # Offline, 256 SGD steps of equivalent MLPs false-alarmed at step 199 to 241: the gradients had
    # shrunk 50-fold since step 0, and the allowance was relative to the largest gradient so far.
    lr = 0.1
    early = np.array([0.067, 0.05], np.float32)  # step 0's gradients, both sides
    bg = np.array([1.192e-3, 2.6e-3], np.float32)  # step 200's
    rg = bg + np.array([3e-5, 0.0], np.float32)  # 2.5% apart: the runs' weights drifted a little
    bu, ru = -lr * bg, -lr * rg
    t = _compare(bu, ru)
    assert not t.passed
    redone = discount_gradients(t, bu, ru, [(early, early), (bg, rg)], "strict")
    assert redone.passed and redone.note.startswith("1 element(s) differ by what the gradients")
    # The same gradients with a learning rate 1% off are not explained.
    assert discount_gradients(_compare(bu, 1.01 * ru), bu, 1.01 * ru, [(early, early), (bg, rg)], "strict").ratio > 1


def test_updates_written_over_the_copies_before_are_the_updates_and_take_no_new_array():
    from nbdiff.engine.training.updates import _difference

    rng = np.random.RandomState(0)
    after = rng.randn(64, 32).astype("float32")
    before = rng.randn(64, 32).astype("float32")
    expected = after - before
    got = _difference(after, before, into_before=True)
    assert got is before and np.array_equal(got, expected)
    kept = rng.randn(64, 32).astype("float32")
    kept.flags.writeable = False  # a snapshot the caller still reads (a spooled step's weights)
    apart = _difference(after, kept, into_before=False)
    assert apart is not kept and np.array_equal(apart, after - kept)
    assert _difference(after, kept, into_before=True) is not kept
