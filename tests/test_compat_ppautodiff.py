"""ppautodiff's autodiff through nbdiff.compat.ppautodiff: the README example and a bugged port."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.compat.ppautodiff import autodiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from tests.seed_models import simple_layer, simple_module  # noqa: E402


def test_readme_example_prints_success(capsys):
    layer, module = simple_layer(), simple_module()
    inp = paddle.rand((100, 100)).numpy().astype("float32")
    result = autodiff(layer, module, inp, auto_weights=True, options={"atol": 1e-4})
    assert result == True and "SUCCESS !!!" in capsys.readouterr().out  # noqa: E712


def test_bugged_port_fails_at_the_layer(capsys):
    inp = paddle.rand((100, 100)).numpy().astype("float32")
    result = autodiff(simple_layer("act"), simple_module(), (inp, inp))
    assert result == False and result.first_divergence.base_path == "act"  # noqa: E712
    assert "FAILED !!!" in capsys.readouterr().out


def test_unknown_option_and_bad_input():
    inp = paddle.rand((100, 100)).numpy().astype("float32")
    with pytest.raises(OptionError, match="'single_step'"):
        autodiff(simple_layer(), simple_module(), inp, options={"single_step": True})
    with pytest.raises(OptionError, match="example_inp"):
        autodiff(simple_layer(), simple_module(), [inp])
    result = autodiff(
        simple_layer(), simple_module(), inp, auto_weights=False, options={"rtol": 1e-3, "compare_mode": "mean"}
    )
    assert not result  # no weight copy: two random initialisations
