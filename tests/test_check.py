"""check_config: the pre-flight that lists differing layer arguments, both directions."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.test_explain import _net  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
@pytest.mark.parametrize("inputs", [None, X], ids=["structure", "execution"])
def test_every_differing_argument_is_listed(base_fw, raw_fw, inputs):
    found = nbdiff.check_config(_net(base_fw), _net(raw_fw, eps=1e-3, approximate=True, p=0.3), inputs)
    assert not found and found.by == ("structure" if inputs is None else "execution")
    listed = {(m.base_path, a.name) for m in found.mismatches for a in m.arguments}
    assert listed == {("norm", "eps"), ("act", "approximate"), ("drop", "dropout p")}
    assert "eps: base 1e-05, raw 0.001" in found.report() and "<td>0.001</td>" in found._repr_html_()


def test_an_equivalent_port_passes_and_momentum_is_read_in_torch_meaning():
    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4, momentum=0.1)

    class P(paddle.nn.Layer):
        def __init__(self, momentum=0.9):
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)
            self.bn = paddle.nn.BatchNorm2D(4, momentum=momentum)

    ok = nbdiff.check_config(T(), P())
    assert ok and ok.paired == 3 and "no argument differs" in repr(ok)
    bad = nbdiff.check_config(P(momentum=0.1), T())  # paddle -> torch: the torch value copied verbatim
    assert [(m.base_path, [a.name for a in m.arguments]) for m in bad.mismatches] == [("bn", ["momentum"])]


def test_the_line_magic_check_runs_no_training():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "nbdiff")
        tnet, pnet = _net("torch"), _net("paddle", eps=1e-3)
        before = [p.detach().clone() for p in tnet.parameters()]
        shell.user_ns.update(tnet=tnet, pnet=pnet)
        assert shell.run_cell("%modeldiff tnet pnet --check --out pre").success
        assert [m.base_path for m in shell.user_ns["pre"].mismatches] == ["norm"]
        assert all(torch.equal(a, b) for a, b in zip(before, tnet.parameters()))
        assert not shell.run_cell("%modeldiff tnet pnet").success  # INPUTS missing without --check
    finally:
        InteractiveShell.clear_instance()


def test_a_swapped_activation_class_is_listed_when_paired_by_execution():
    class T(torch.nn.Module):
        def __init__(self, act):
            super().__init__()
            self.fc, self.act = torch.nn.Linear(8, 8), act

        def forward(self, x):
            return self.act(self.fc(x))

    class P(paddle.nn.Layer):
        def __init__(self, act):
            super().__init__()
            self.fc, self.act = paddle.nn.Linear(8, 8), act

        def forward(self, x):
            return self.act(self.fc(x))

    found = nbdiff.check_config(T(torch.nn.ReLU6()), P(paddle.nn.Hardswish()), X)
    assert [m.describe() for m in found.mismatches] == [
        "`act` (ReLU6) ~ raw `act` (Hardswish): activation: base 'ReLU6', raw 'Hardswish'"
    ]
    assert nbdiff.check_config(T(torch.nn.ReLU6()), P(paddle.nn.ReLU6()), X)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_with_inputs_trees_built_differently_pair_every_layer_with_weights(direction):
    # torchvision's ShuffleNetV2 against paddle.vision's (stages in Sequentials, flat branches, against
    # sibling units and Conv-Norm-Activation wrappers): pairing used to drift and pair a later stage's
    # depthwise conv with an earlier 1x1 conv. Only containers may stay unpaired now.
    from tests.zoo.pairs import shufflenet

    base, raw, x, _ = shufflenet()()
    if direction == "paddle->torch":
        base, raw = raw, base
    found = nbdiff.check_config(base, raw, inputs=x)
    assert found.by == "execution" and found.paired == 170, found.report()
    assert not found.mismatches, found.report()
    for model, unpaired in ((base, found.unpaired_base), (raw, found.unpaired_raw)):
        if isinstance(model, torch.nn.Module):
            layers = dict(model.named_modules())
            own = {p: list(layers[p].parameters(recurse=False)) for p in unpaired}
        else:
            layers = dict(model.named_sublayers())
            own = {p: list(layers[p].parameters(include_sublayers=False)) for p in unpaired}
        assert not [p for p, ws in own.items() if ws], own  # only containers and weightless layers stay unpaired


def test_with_inputs_a_stateful_models_python_state_is_left_as_found():
    # check_config runs each model once to pair by execution: a KV cache grew and a counter moved.
    from tests.structure_models import decoder

    base, raw = decoder("torch"), decoder("paddle")
    entry = (torch.zeros(2, 1, 8), torch.zeros(2, 1, 8))  # the user's earlier token
    base.cache.append(entry)
    x = np.random.RandomState(0).randn(2, 1, 8).astype("float32")
    nbdiff.check_config(base, raw, inputs=x)
    assert (base.calls, raw.calls, len(raw.cache)) == (0, 0, 0) and base.cache == [entry]
    assert nbdiff.LayerMap.auto(base, raw, x) is not None
    assert (base.calls, raw.calls, len(raw.cache)) == (0, 0, 0) and base.cache == [entry]
