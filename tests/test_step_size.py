"""engine/step_size: each side's update over its own gradient tells a learning rate apart."""

import numpy as np

from nbdiff.engine.training.step_size import step_size


def test_plain_sgd_reads_as_minus_its_learning_rate_whatever_the_gradient():
    rng = np.random.RandomState(0)
    g = rng.randn(8, 4).astype("float32")
    w = rng.randn(8, 4).astype("float32")
    u = (w - np.float32(0.1) * g) - w  # as a dump keeps it: two float32 weights' difference
    assert abs(step_size(u, g) + 0.1) < 1e-5
    other = rng.randn(8, 4).astype("float32") * 5  # another gradient, another update: the same number
    assert abs(step_size((w - np.float32(0.1) * other) - w, other) + 0.1) < 1e-5


def test_an_update_that_is_not_one_number_times_its_gradient_says_nothing():
    rng = np.random.RandomState(1)
    g, w = rng.randn(16), rng.randn(16)
    assert step_size(-0.01 * np.sign(g), g) is None  # Adam's first step: lr times the sign
    assert step_size(-0.1 * (g + 0.1 * w), g) is None  # weight decay
    assert step_size(np.zeros(16), g) is None and step_size(-0.1 * g, np.zeros(16)) is None
    assert step_size(-0.1 * g[:8], g) is None  # shapes apart
    nan = g.copy()
    nan[0] = np.nan
    assert step_size(-0.1 * nan, nan) is None
    # Updates below the rounding of the weights they are the difference of cannot be read.
    assert step_size(-1e-9 * g, g, floor=1e-7) is None
