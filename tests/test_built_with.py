"""The arguments layers are built with, remembered while nbdiff is loaded in a notebook."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")
pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.origin.built_with import built_with  # noqa: E402
from nbdiff.trace.origin.constructors import NotRebuildable, constructor_of  # noqa: E402

CELL = '''
import numpy as np, torch, paddle


class TorchGate(torch.nn.Module):
    """Hand-written: its arguments become other things, none is kept under its name."""

    def __init__(self, features, scale, mode="tanh"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((features,), scale))
        self.act = torch.tanh if mode == "tanh" else torch.sigmoid

    def forward(self, x):
        return self.act(x * self.weight)


class PaddleGate(paddle.nn.Layer):
    def __init__(self, features, scale, mode="tanh"):
        super().__init__()
        self.weight = self.create_parameter([features], default_initializer=paddle.nn.initializer.Constant(scale))
        self.act = paddle.tanh if mode == "tanh" else paddle.nn.functional.sigmoid

    def forward(self, x):
        return self.act(x * self.weight)
'''


@pytest.fixture()
def shell():
    ip = InteractiveShell.instance()
    original = (torch.nn.Module.__init__, paddle.nn.Layer.__init__)
    ip.run_line_magic("load_ext", "nbdiff")
    yield ip
    ip.run_line_magic("unload_ext", "nbdiff")
    InteractiveShell.clear_instance()
    # Unloaded, the frameworks' own __init__ is back.
    assert (torch.nn.Module.__init__, paddle.nn.Layer.__init__) == original


def test_a_layer_built_after_load_ext_can_be_rebuilt_though_it_keeps_no_argument(shell):
    assert shell.run_cell(CELL).success
    assert shell.run_cell("t, p = TorchGate(4, scale=0.5), PaddleGate(4, 0.5, mode='sigmoid')").success
    # Its arguments are not on the layer: `scale` became a weight, `mode` a function.
    assert not hasattr(shell.user_ns["t"], "scale") and not hasattr(shell.user_ns["t"], "mode")
    t, p = shell.user_ns["t"], shell.user_ns["p"]
    assert built_with(t) == {"features": 4, "scale": 0.5, "mode": "tanh"}
    assert built_with(p) == {"features": 4, "scale": 0.5, "mode": "sigmoid"}
    assert (
        constructor_of(framework_of(p, "p"), p)
        .call_text()
        .endswith("PaddleGate(features=4, scale=0.5, mode='sigmoid')")
    )
    # A library layer's arguments are its own class's, not a subclass's or a wrapper's.
    assert built_with(torch.nn.Linear(3, 2)).items() >= {"in_features": 3, "out_features": 2, "bias": True}.items()


def test_a_layer_built_before_load_ext_is_refused_with_the_way_out():
    ns = {}
    exec(compile(CELL, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    gate = ns["TorchGate"](4, 0.5)
    assert built_with(gate) == {}
    with pytest.raises(NotRebuildable, match="after %load_ext nbdiff"):
        constructor_of(framework_of(gate, "g"), gate)


def test_repro_of_a_notebook_layer_that_keeps_no_argument(shell, tmp_path):
    from tests.test_repro import _diverges_until_fixed

    assert shell.run_cell(CELL, store_history=True).success
    run = "import nbdiff\nresult = nbdiff.auto_diff(TorchGate(4, 0.5), PaddleGate(4, 0.5, mode='sigmoid'), np.ones((2, 4), 'float32'))"
    assert shell.run_cell(run, store_history=True).success
    script = shell.user_ns["result"].repro(str(tmp_path / "repro"))
    _diverges_until_fixed(script, "mode='sigmoid'", "mode='tanh'")
