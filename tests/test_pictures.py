"""The data of the panel's error pictures: small, JSON-safe, worst error kept."""

import json

import numpy as np
import pytest

from nbdiff.view.pictures import BINS, MAP_COLS, MAP_ROWS, as_matrix, error_picture, pool


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 1000), (600, 700)])
def test_any_shape_gives_a_small_json_picture(shape):
    base = np.asarray(np.random.RandomState(0).randn(*shape), dtype="float32")
    raw = base + np.float32(1e-3) * np.asarray(np.random.RandomState(1).randn(*shape), dtype="float32")
    p = error_picture(base, raw, passed=False)
    assert len(p["counts"]) == BINS and p["rows"] <= MAP_ROWS and p["cols"] <= MAP_COLS
    assert len(p["cells"]) == p["rows"] * p["cols"] and all(-1 <= v <= 256 for v in p["cells"])
    assert sum(p["counts"]) + p["zeros"] + p["nonfinite"] == p["total"] == base.size
    assert len(json.dumps(p, allow_nan=False)) < 12_000


def test_the_worst_error_survives_pooling_and_nan_is_marked():
    base = np.zeros((500, 500), "float32")
    raw = base.copy()
    raw[123, 456] = 1.0
    raw[0, 0] = 1e-6
    p = error_picture(base, raw, passed=False)
    assert max(p["cells"]) == 255 and p["zeros"] == base.size - 2
    raw[1, 1] = np.nan
    assert 256 in error_picture(base, raw, passed=False)["cells"]
    assert error_picture(base, base.copy(), passed=True)["cells"] == [-1] * (p["rows"] * p["cols"])
    assert error_picture(base, raw[:2], passed=False) is None


def test_matrix_and_pool():
    assert as_matrix(np.zeros((2, 3, 5))).shape == (6, 5)
    assert as_matrix(np.zeros(())).shape == (1, 1)
    m = np.arange(100.0).reshape(10, 10)
    pooled = pool(m, 3, 4)
    assert pooled.shape == (3, 4) and pooled.max() == 99


def test_the_map_judges_nan_inf_and_masks_as_the_comparison_does():
    # A causal mask: -inf on both sides, or -inf against -1e9, is the same mask (the comparison passes);
    # NaN against a number, or -inf against -1e3 (no mask value), is an error the map must show.
    scores = np.random.RandomState(0).randn(6, 6).astype("float32")
    upper = np.triu(np.ones((6, 6), dtype=bool), 1)
    base = np.where(upper, -np.inf, scores).astype("float32")
    for raw, masked in ((base.copy(), 0), (np.where(upper, -1e9, scores).astype("float32"), 15)):
        p = error_picture(base, raw, passed=True)
        assert p["nonfinite"] == 0 and p["zeros"] == 36 and p["masked"] == masked
        assert 256 not in p["cells"]
    off = np.where(upper, -1e3, scores).astype("float32")
    off[0, 0] = np.nan
    p = error_picture(base, off, passed=False)
    assert p["nonfinite"] == 16 and p["masked"] == 0 and 256 in p["cells"]


def test_the_picture_lays_the_tensors_side_by_side_as_the_comparison_does():
    # Heads as [batch, positions, heads, dim] against [batch, heads, positions, dim]: the comparison reads
    # raw's axes in their order, and the map drew the flattened difference, red where nothing differs.
    base = np.random.RandomState(0).randn(2, 4, 8, 8).astype("float32")
    raw = base.transpose(0, 2, 1, 3).copy()
    p = error_picture(base, raw, passed=True)
    assert p["zeros"] == p["total"] == base.size and p["shape"] == [2, 4, 8, 8]
    # One side not yet broadcast is drawn broadcast, as compared (it was no picture at all).
    assert error_picture(np.ones((2, 3, 4), "float32"), np.ones((1, 3, 4), "float32"), passed=True)["zeros"] == 24
