"""Figures to save and share: the blamed tensor's error, without pyplot, for any tensor shape."""

import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from nbdiff.view.plots import error_figure  # noqa: E402


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 1000), (600, 700)])
def test_error_figures_are_png_for_any_shape(shape):
    base = np.asarray(np.random.RandomState(0).randn(*shape), dtype="float32")
    fig = error_figure(base, base + 1e-3, "out")
    assert fig._repr_png_().startswith(b"\x89PNG")
    assert "matplotlib.pyplot" not in sys.modules


def test_equal_and_nan_tensors_still_plot():
    a = np.zeros((4, 4), "float32")
    assert error_figure(a, a.copy())._repr_png_().startswith(b"\x89PNG")
    b = a.copy()
    b[0, 0] = np.nan
    assert error_figure(a, b)._repr_png_().startswith(b"\x89PNG")


def test_the_blamed_tensor_of_a_result_plots():
    pytest.importorskip("torch")
    pytest.importorskip("paddle")
    import nbdiff
    from tests.fault_suite.models import BUILDERS, inputs

    failed = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    assert failed.plot_divergence()._repr_png_().startswith(b"\x89PNG")
    agreed = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp"))
    assert agreed.plot_divergence() is None
