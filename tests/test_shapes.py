"""Two shapes that hold one tensor's values (judge/shapes): broadcast, last positions, flattened."""

import numpy as np

from nbdiff.judge.shapes import broadcast_shape, fitted_shapes, positions_cut


def test_one_side_not_yet_broadcast_is_compared_broadcast():
    raw, base = np.ones((1, 3, 4), "float32"), np.ones((2, 3, 4), "float32")
    a, b, note = fitted_shapes(raw, base)
    assert a.shape == b.shape == (2, 3, 4) and "broadcasting" in note
    assert broadcast_shape((1, 3), (2, 4)) is None


def test_a_generation_step_that_kept_the_last_positions_is_compared_with_the_others_last():
    raw = np.arange(2 * 5 * 3, dtype="float32").reshape(2, 5, 3)
    base = raw[:, -1:].copy()
    a, b, note = fitted_shapes(raw, base)
    assert np.array_equal(a, b) and "last 1 position" in note
    assert positions_cut((2, 5, 3), (2, 1, 3)) and not positions_cut((2, 5, 3), (2, 5, 4))


def test_the_same_values_in_another_shape_compare_flattened_and_other_sizes_not_at_all():
    raw, base = np.arange(6, dtype="float32").reshape(2, 3), np.arange(6, dtype="float32").reshape(3, 2)
    a, b, note = fitted_shapes(raw, base)
    assert a.shape == b.shape == (3, 2) and "flattened" in note
    assert fitted_shapes(np.ones(5), np.ones(6)) is None


def test_attention_heads_laid_out_another_way_compare_by_their_axes_not_flattened():
    # paddleformers' Gemma 3 normalises q as [batch, positions, heads, dim], transformers' as
    # [batch, heads, positions, dim]: compared flattened, an equivalent port's q_norm read 39,000x.
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2, 4, 8, 8)).astype("float32")
    raw = base.transpose(0, 2, 1, 3).copy()
    a, b, note = fitted_shapes(raw, base)
    assert np.array_equal(a, b) and "(0, 2, 1, 3)" in note
    # Axes of one size: of the orders that fit, the one holding base's values.
    square = rng.standard_normal((3, 5, 5)).astype("float32")  # (5, 3, 5) fits it as (1, 0, 2) and (1, 2, 0)
    a, b, note = fitted_shapes(square.transpose(1, 0, 2).copy(), square)
    assert np.array_equal(a, b) and "(1, 0, 2)" in note
    # A bug in such a layout still shows: the closest layout, not an exact one.
    wrong = raw.copy()
    wrong[0, 0, 0, 0] += 1.0
    a, b, note = fitted_shapes(wrong, base)
    assert float(np.abs(a - b).max()) == 1.0 and "(0, 2, 1, 3)" in note
