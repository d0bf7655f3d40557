import numpy as np
import pytest

from nbdiff.judge.metrics import compare_tensors, cosine, max_abs, max_rel, nan_count
from nbdiff.judge.tolerance import Tolerance, resolve_tolerance


def test_pure_metrics():
    a, b = np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.5, 4.0])
    assert max_abs(a, b) == 0.5
    assert max_rel(a, b) == 0.2
    assert abs(cosine(a, a) - 1) < 1e-12
    assert nan_count(np.array([np.nan, 1.0])) == 1


def test_scaled_default_atol_ignores_rounding_near_zero():
    b = np.array([1.0, 1e-9], dtype=np.float32)
    a = b + np.array([1e-7, 1e-7], dtype=np.float32)
    assert compare_tensors("x", a, b, resolve_tolerance(None, None, "float32")).passed
    assert not compare_tensors("x", a, b, resolve_tolerance(0.0, 1e-7, "float32")).passed


def test_nan_mismatch_is_a_divergence_not_a_crash():
    d = compare_tensors("x", np.array([np.nan, 1.0]), np.array([0.0, 1.0]), resolve_tolerance(None, None, "float32"))
    assert not d.passed and d.nan_raw == 1 and d.nan_base == 0


def test_modes():
    b = np.array([1.0, -1.0])
    a = np.array([-1.0, 1.0])
    tol = resolve_tolerance(None, None, "float32")
    assert not compare_tensors("x", a, b, tol, "strict").passed
    assert compare_tensors("x", a, b, tol, "mean").passed
    assert compare_tensors("x", a, b, tol, "abs_mean").passed


def test_scalars_and_empty_tensors_compare():
    tol = resolve_tolerance(None, None, "float32", "float32")
    assert compare_tensors("loss", np.float32(1.5), np.float32(1.5), tol).ratio == 0.0
    assert compare_tensors("loss", np.array(2.0, "float32"), np.array(1.0, "float32"), tol).ratio > 1
    assert compare_tensors("e", np.zeros((0, 3), "float32"), np.zeros((0, 3), "float32"), tol).passed


def test_identical_tensors_short_cut_to_exact_agreement():
    a = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    t = compare_tensors("x", a.copy(), a, resolve_tolerance(None, None, "float32"))
    assert (t.max_abs, t.max_rel, t.mean_abs, t.cosine, t.ratio, t.passed) == (0.0, 0.0, 0.0, 1.0, 0.0, True)


def test_broadcast_equivalent_shapes_are_compared_after_broadcasting():
    # A rotary embedding returns (1, S, D) on one side and (B, S, D) on the other.
    one = np.random.RandomState(0).randn(1, 5, 4).astype("float32")
    tol = resolve_tolerance(None, None, "float32")
    d = compare_tensors("out", np.repeat(one, 3, axis=0), one, tol)
    assert d.passed and "broadcast" in d.note
    assert (d.base_shape, d.raw_shape) == ((1, 5, 4), (3, 5, 4))
    wrong = np.repeat(one, 3, axis=0)
    wrong[2] += 1.0
    assert not compare_tensors("out", wrong, one, tol).passed
    assert not compare_tensors("out", np.zeros((3, 5, 2), "float32"), one, tol).passed


def test_lazy_comparison_decides_at_once_and_gives_the_same_metrics_when_read():
    from nbdiff.judge.tolerance import resolve_tolerance

    tol = resolve_tolerance(None, None, "float32")
    b = np.random.RandomState(0).randn(64, 32).astype("float32")
    for a in (b + np.float32(1e-7) * np.random.RandomState(1).randn(64, 32).astype("float32"), b * 1.01):
        eager = compare_tensors("x", a, b, tol)
        lazy = compare_tensors("x", a, b, tol, lazy=True)
        assert lazy.passed == eager.passed
        assert (object.__getattribute__(lazy, "detail") is not None) == eager.passed  # only passing ones wait
        for name in ("ratio", "max_rel", "mean_abs", "cosine", "max_abs"):
            assert getattr(lazy, name) == pytest.approx(getattr(eager, name), rel=1e-5, abs=1e-12), name


def test_renaming_a_lazy_comparison_keeps_its_metrics_deferred():
    # single_step renamed every given-input comparison with dataclasses.replace, which reads every
    # field: the full metrics of ~250 passing tensors per step were computed for nothing.
    from nbdiff.judge.metrics import _Detail
    from nbdiff.judge.tolerance import resolve_tolerance

    b = np.random.RandomState(0).randn(64, 32).astype("float32")
    a = b + np.float32(1e-7) * np.random.RandomState(1).randn(64, 32).astype("float32")
    lazy = compare_tensors("x", a, b, resolve_tolerance(None, None, "float32"), lazy=True)
    detail = object.__getattribute__(lazy, "detail")
    renamed = lazy.renamed("given:x")
    assert renamed.name == "given:x" and object.__getattribute__(renamed, "detail") is detail
    assert isinstance(detail, _Detail) and detail._arrays is not None  # nothing computed yet
    assert renamed.ratio == lazy.ratio < 1.0 and renamed.passed


def test_a_hint_known_to_cover_base_skips_measuring_it_and_changes_nothing():
    # Backward passes its scale hint (the largest gradient around, at least max|base|): the
    # comparison then needs no pass of its own over |base|.
    tol = resolve_tolerance(None, None, "float32")
    b = np.random.RandomState(0).randn(64, 32).astype("float32")
    hint = float(np.abs(b).max())
    noise = np.float32(1e-7) * np.random.RandomState(1).randn(64, 32).astype("float32")
    for a in (b + noise, b * 1.01, b.copy()):
        for lazy in (False, True):
            for h in (hint, 4 * hint):
                plain = compare_tensors("x", a, b, tol, "strict", h, lazy)
                covered = compare_tensors("x", a, b, tol, "strict", h, lazy, hint_covers=True)
                for name in ("ratio", "max_rel", "mean_abs", "cosine", "max_abs"):
                    assert getattr(covered, name) == getattr(plain, name), name


def test_an_infinity_and_a_mask_value_of_its_sign_are_the_same_mask():
    """base ``masked_fill(-inf)``, raw ``masked_fill(-1e9)``: the same mask, not an infinite error
    (the ``--api`` group rows read ``inf``); an infinity against a small or opposite value still is."""
    tol = Tolerance(1e-5, 1e-4, scaled=True)
    base = np.array([[0.5, -np.inf, -np.inf], [0.1, 0.2, -np.inf]], dtype=np.float32)
    raw = np.where(np.isinf(base), np.float32(-1e9), base)
    t = compare_tensors("scores", raw, base, tol)
    assert t.passed and t.ratio == 0.0 and "masked alike at 3 position(s)" in t.note and "-inf" in t.note
    assert (t.inf_base, t.inf_raw) == (3, 0)
    off = raw.copy()
    off[0, 0] = 0.6  # a real difference beside the mask is still found, and said as such
    t = compare_tensors("scores", off, base, tol)
    assert not t.passed and np.isfinite(t.ratio) and "NaN/Inf differ" not in t.note
    for wrong in (np.float32(1e9), np.float32(-5.0)):  # the other sign, or not a mask value
        t = compare_tensors("scores", np.where(np.isinf(base), wrong, base), base, tol)
        assert t.ratio == np.inf and t.note == "NaN/Inf differ"


@pytest.mark.parametrize("size", [64 * 32, (1 << 16) + 8])  # fresh work arrays, and the reused scratch pool
def test_small_and_large_tensors_are_measured_alike(size):
    from nbdiff.judge.tolerance import resolve_tolerance

    tol = resolve_tolerance(None, None, "float32")
    rng = np.random.RandomState(0)
    b = rng.randn(size).astype("float32")
    close = b + np.float32(1e-7) * rng.randn(size).astype("float32")
    off = b.copy()
    off[size // 3] += 0.5
    nan = close.copy()
    nan[5] = np.nan
    for a, passes in ((close, True), (off, False), (nan, False), (b.copy(), True)):
        got = compare_tensors("x", a, b, tol, lazy=True)
        d64 = np.abs(a.astype(np.float64) - b)
        assert got.passed is passes
        assert (
            got.max_abs == pytest.approx(float(d64.max()), rel=1e-6, nan_ok=True) or a is nan and got.max_abs == np.inf
        )
        if passes:
            assert got.mean_abs == pytest.approx(float(d64.mean()), rel=1e-5, abs=1e-12)
        else:
            assert got.ratio > 1.0
    assert compare_tensors("x", nan, b, tol).nan_raw == 1


def test_the_worst_ratio_of_many_computes_only_the_deferred_ratios_that_could_be_the_worst():
    # The step chart and the update check asked every lazily passed tensor its ratio: each one's full
    # metrics (four passes over it) for a maximum that the bounds of most could never reach.
    from nbdiff.judge.metrics import worst_ratio
    from nbdiff.judge.tolerance import resolve_tolerance

    tol = resolve_tolerance(None, None, "float32")
    rng = np.random.RandomState(0)
    b = rng.randn(64, 32).astype("float32")
    tensors = [
        compare_tensors(f"t{i}", b + np.float32(scale) * rng.randn(64, 32).astype("float32"), b, tol, lazy=True)
        for i, scale in enumerate((1e-8, 1e-7, 1e-6, 1e-8))
    ]
    exact = max(compare_tensors("x", t.detail._arrays[0], t.detail._arrays[1], tol).ratio for t in tensors)
    assert all(t.ratio_bound >= 0 for t in tensors)
    assert worst_ratio(tensors) == pytest.approx(exact, rel=1e-6)
    computed = [t.detail._arrays is None for t in tensors]
    assert computed[2] and not computed[0] and not computed[3], computed  # the small ones stay deferred
    assert all(t.ratio <= t.ratio_bound * (1 + 1e-6) for t in tensors)
    assert worst_ratio([], 0.5) == 0.5
