"""Error plots: PNG bytes, without pyplot, for any tensor shape."""

import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from nbdiff.notebook.plots import as_matrix, error_plots  # noqa: E402


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 1000), (600, 700)])
def test_plots_are_png_for_any_shape(shape):
    base = np.asarray(np.random.RandomState(0).randn(*shape), dtype="float32")
    raw = base + 1e-3
    plots = error_plots(base, raw, "out")
    assert set(plots) == {"histogram", "heatmap"}
    assert all(p.startswith(b"\x89PNG") for p in plots.values())
    assert "matplotlib.pyplot" not in sys.modules


def test_equal_and_nan_tensors_still_plot():
    a = np.zeros((4, 4), "float32")
    assert error_plots(a, a.copy())["histogram"].startswith(b"\x89PNG")
    b = a.copy()
    b[0, 0] = np.nan
    assert error_plots(a, b)["heatmap"].startswith(b"\x89PNG")


def test_as_matrix_keeps_the_last_dimension_as_columns():
    assert as_matrix(np.zeros((2, 3, 5))).shape == (6, 5)
    assert as_matrix(np.zeros(())).shape == (1, 1)
