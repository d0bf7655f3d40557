"""Tolerance defaults, explicit overrides, and the summed-terms count of parameter gradients."""

from nbdiff.judge.tolerance import DEFAULTS, Tolerance, resolve_tolerance, summed_terms


def test_defaults_take_the_looser_dtype_and_explicit_values_win():
    t = resolve_tolerance(None, None, "float32", "float16")
    assert (t.atol, t.rtol, t.scaled) == (*DEFAULTS["float16"], True)
    t = resolve_tolerance(1e-3, None, "float32")
    assert (t.atol, t.rtol, t.scaled) == (1e-3, DEFAULTS["float32"][1], False)
    assert resolve_tolerance(None, None, "int64").atol == 0.0


def test_summed_terms_counts_positions_per_output_channel():
    assert summed_terms((16,), (32, 16, 32, 32)) == 32 * 32 * 32  # conv bias: batch x height x width
    assert summed_terms((16, 8, 3, 3), (32, 16, 32, 32)) == 32 * 32 * 32  # conv weight
    assert summed_terms((64, 16), (8, 64)) == 8  # torch Linear weight [out, in]: the batch
    assert summed_terms((16, 64), (8, 64)) == 8  # paddle Linear weight [in, out]
    assert summed_terms((5,), (2, 3)) == 1  # no shared dimension: no assumption
    assert summed_terms((4,), ()) == 1


def test_a_tolerance_asked_again_is_the_one_made_before():
    # A check asks for a tolerance for every tensor it compares (1.5 µs each, 7% of a deep model's comparison).
    first = resolve_tolerance(None, None, "float32", "paddle.float32")
    assert resolve_tolerance(None, None, "float32", "paddle.float32") is first
    assert resolve_tolerance(1e-3, None, "float32", "paddle.float32") == Tolerance(1e-3, first.rtol, scaled=False)
