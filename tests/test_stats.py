"""Per-tensor statistics: accurate to far below any comparison tolerance, whatever the dtype and size."""

import os
import subprocess
import sys

import numpy as np
import pytest

from nbdiff.trace import stats as stats_module
from nbdiff.trace.stats import (
    sample_json,
    sample_of_json,
    sample_positions,
    stats_from_sums,
    tensor_sample,
    tensor_stats,
)


def test_a_constant_has_no_spread():
    # E[x^2] - E[x]^2 in float32 gave a scalar loss a std of about 7e-6.
    for value in (np.float32(2.302585), np.full(1000, 1234.567, np.float32)):
        assert tensor_stats(np.asarray(value)).std == 0.0


@pytest.mark.parametrize("offset", [0.0, 1.0, 1e4, -1e3])
@pytest.mark.parametrize("spread", [1e-2, 1.0, 1e3])
def test_statistics_match_float64_numpy_across_chunks(monkeypatch, offset, spread):
    # Far below any comparison tolerance (those scale with max |x|), over several chunks; the
    # spread is also kept where E[x^2] - E[x]^2 would cancel (a large offset, a small spread).
    monkeypatch.setattr(stats_module, "_CHUNK", 777)
    x = (np.random.default_rng(0).standard_normal(10_000) * spread + offset).astype(np.float32)
    s, ref = tensor_stats(x), x.astype(np.float64)
    scale = np.abs(ref).max()
    assert abs(s.mean - ref.mean()) <= 1e-6 * scale and abs(s.abs_mean - np.abs(ref).mean()) <= 1e-6 * scale
    assert abs(s.std - ref.std()) <= 1e-5 * ref.std()
    assert (s.min, s.max, s.nan, s.inf) == (float(x.min()), float(x.max()), 0, 0)


def test_low_precision_and_integer_tensors_are_summed_without_rounding_away():
    halves = np.full(100_000, 0.1, np.float16)
    halves[0] = 0.2  # not constant
    assert np.isclose(tensor_stats(halves).mean, halves.astype(np.float64).mean(), rtol=1e-6)
    ints = np.arange(2**20, dtype=np.int64) * 2**20
    assert tensor_stats(ints).mean == ints.astype(np.float64).mean()


def test_non_finite_values_are_counted_and_left_out():
    s = tensor_stats(np.array([1.0, np.nan, np.inf, 3.0], np.float32))
    assert (s.nan, s.inf, s.mean, s.std) == (1, 1, 2.0, 1.0)
    assert tensor_stats(np.array([], np.float32)).std == 0.0


def test_values_whose_squares_overflow_float32_still_have_a_finite_spread():
    x = np.array([1e20, -1e20, 3e20, 0.0], np.float32)
    ref = x.astype(np.float64)
    assert np.isclose(tensor_stats(x).std, ref.std(), rtol=1e-6)


@pytest.mark.parametrize("values", [[0.0, 1.0, 3.0], [-2.0, -1.0, -0.5]])
def test_a_tensor_of_one_sign_has_its_sum_as_absolute_sum(values):
    x = np.array(values, np.float32)
    assert tensor_stats(x).abs_mean == pytest.approx(np.abs(x.astype(np.float64)).mean(), rel=1e-7)


_OTHER_THREADS_CPU = """
import resource, time
import numpy as np
from nbdiff.trace.stats import sample_json, sample_of_json, sample_positions, tensor_sample, tensor_stats

a = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
tensor_stats(a)
usage = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # every thread of the process
process, own = usage(), time.thread_time()
for _ in range(10):
    tensor_stats(a)
own = time.thread_time() - own
print((usage() - process - own) / own)
"""


@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2 or sys.platform != "linux", reason="needs 2 cores and per-thread CPU time"
)
def test_statistics_start_no_threads_of_their_own():
    # numpy's OpenBLAS splits a long dot product over every core, and its threads then spin on
    # the cores the framework computes on: a torch CNN step recorded with default threads took
    # 5-6x its bare time instead of 3x. The statistics run on the caller's thread alone.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", _OTHER_THREADS_CPU], env=env, capture_output=True, text=True, check=True
    )
    assert float(out.stdout) < 0.2, f"other threads used {float(out.stdout):.2f}x the caller's CPU time"


def test_statistics_of_a_concatenation_follow_from_its_parts():
    # A fused qkv's output, in a statistics-only dump, is its members' outputs concatenated.
    from nbdiff.trace.stats import concatenated_stats

    rng = np.random.RandomState(0)
    parts = [rng.randn(2, 3, 8).astype("float32") * s + m for s, m in ((1.0, 0.0), (3.0, 2.0), (0.5, -1.0))]
    parts[1][0, 0, 0] = np.nan
    whole = tensor_stats(np.concatenate(parts, axis=-1))
    got = concatenated_stats([(tensor_stats(p), p.size) for p in parts])
    np.testing.assert_allclose(got.values(), whole.values(), rtol=1e-5)
    assert (got.nan, got.inf) == (whole.nan, whole.inf) == (1, 0)


def test_a_sample_is_drawn_at_the_same_places_for_the_same_size_in_any_layout():
    a = np.random.RandomState(0).randn(6, 50, 7).astype("float32")
    at = sample_positions(a.size)
    assert at.size == 64 and np.all(np.diff(at) > 0) and at[-1] < a.size
    assert np.array_equal(at, sample_positions(a.size))  # the other side's, recorded elsewhere
    # indexed in place, not copied: a transposed (non-contiguous) tensor gives its own values in order
    t = a.transpose(2, 0, 1)
    assert np.array_equal(tensor_sample(t), np.ascontiguousarray(t).ravel()[at])
    assert np.array_equal(sample_positions(10), np.arange(10))  # a small tensor whole
    assert tensor_sample(np.arange(5)) is None and tensor_sample(np.zeros(0, "float32")) is None


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_a_sample_survives_json_exactly(dtype):
    import json

    x = (np.random.RandomState(1).randn(64) * 1e3).astype(dtype)
    x[3] = np.nan
    back = sample_of_json(json.loads(json.dumps(sample_json(x))), 1000)
    assert back.dtype == x.dtype and np.array_equal(back, x, equal_nan=True)
    with pytest.raises(ValueError, match="has 1 to 10"):
        sample_of_json(sample_json(x), 10)


def test_sample_positions_are_part_of_the_dump_format():
    # Dumps compared across nbdiff and numpy versions must have been sampled at the same places:
    # these positions may never change (integer arithmetic, no random generator's stream).
    assert sample_positions(1000)[:4].tolist() == [12, 21, 37, 48]
    assert sample_positions(7 * 10**9)[:2].tolist() == [74149902, 148609398]


def _sums(x: np.ndarray) -> list[float]:
    """What a framework's reductions hand back, in float64 here."""
    r = x.astype(np.float64)
    return [float(r.min()), float(r.max()), float(r.sum()), float((r * r).sum()), float(np.abs(r).sum())]


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_statistics_from_a_frameworks_sums_are_those_of_the_values(offset):
    # A large offset cancels E[x^2] - E[x]^2: the spread is then asked for around the mean.
    x = (np.random.default_rng(1).standard_normal(5000) + offset).astype(np.float32)
    asked = []

    def spread(m: float) -> float:
        asked.append(m)
        return float(((x.astype(np.float64) - m) ** 2).sum())

    got, want = stats_from_sums(*_sums(x), x.size, spread), tensor_stats(x)
    scale = float(np.abs(x).max())
    for f in ("min", "max", "mean", "std", "abs_mean"):
        assert abs(getattr(got, f) - getattr(want, f)) <= 1e-6 * scale, f
    assert bool(asked) == (offset != 0.0)
    constant = np.full(10, 2.5, np.float32)
    assert stats_from_sums(*_sums(constant), 10, spread) == tensor_stats(constant)


def test_statistics_from_sums_that_are_not_finite_are_left_to_the_host():
    x = np.array([1.0, np.nan], np.float32)
    assert stats_from_sums(*_sums(x), 2, lambda m: 0.0) is None
    assert stats_from_sums(1.0, 3e38, 1.0, float("inf"), 1.0, 2, lambda m: 0.0) is None
