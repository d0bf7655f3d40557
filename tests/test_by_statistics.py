import numpy as np


def test_statistics_of_a_tensor_one_side_has_not_expanded_yet_agree():
    # paddleformers' rotary embedding is (2, 8, 8) where transformers' is (1, 8, 8): the same values
    # repeated over the batch, so the same statistics (a statistics dump said "shape differs")
    from nbdiff.judge.by_statistics import compare_statistics
    from nbdiff.judge.tolerance import resolve_tolerance
    from nbdiff.trace.stats import tensor_stats

    x = np.random.RandomState(0).randn(1, 8, 8).astype(np.float32)
    x[0, 0, 0] = np.nan
    wide = np.broadcast_to(x, (2, 8, 8))
    tol = resolve_tolerance(None, None, "float32", "float32")
    same = compare_statistics("out", tensor_stats(wide), tensor_stats(x), tol, "strict", (1, 8, 8), (2, 8, 8))
    assert same.passed, same
    one_nan = wide.copy()
    one_nan[1, 0, 0] = x[0, 0, 1]  # one NaN where the expanded tensor has two
    assert not compare_statistics(
        "out", tensor_stats(one_nan), tensor_stats(x), tol, "strict", (1, 8, 8), (2, 8, 8)
    ).passed
    other = compare_statistics("out", tensor_stats(wide), tensor_stats(x), tol, "strict", (1, 8, 8), (2, 4, 16))
    assert not other.passed and "shape" in other.note
