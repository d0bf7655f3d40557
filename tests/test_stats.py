"""Per-tensor statistics: exact in float64, whatever the input's dtype and size."""

import numpy as np

from nbdiff.trace import stats as stats_module
from nbdiff.trace.stats import tensor_stats


def test_a_constant_has_no_spread():
    # E[x^2] - E[x]^2 in float32 gave a scalar loss a std of about 7e-6.
    for value in (np.float32(2.302585), np.full(1000, 1234.567, np.float32)):
        assert tensor_stats(np.asarray(value)).std == 0.0


def test_statistics_match_float64_numpy_across_chunks(monkeypatch):
    monkeypatch.setattr(stats_module, "_CHUNK", 7)  # several chunks for a small tensor
    x = (np.random.default_rng(0).standard_normal(100) * 3 + 1e4).astype(np.float32)
    s = tensor_stats(x)
    ref = x.astype(np.float64)
    assert np.isclose(s.mean, ref.mean(), rtol=0, atol=1e-9) and np.isclose(s.std, ref.std(), rtol=1e-12)
    assert (s.min, s.max, s.nan, s.inf) == (float(x.min()), float(x.max()), 0, 0)


def test_non_finite_values_are_counted_and_left_out():
    s = tensor_stats(np.array([1.0, np.nan, np.inf, 3.0], np.float32))
    assert (s.nan, s.inf, s.mean, s.std) == (1, 1, 2.0, 1.0)
    assert tensor_stats(np.array([], np.float32)).std == 0.0
