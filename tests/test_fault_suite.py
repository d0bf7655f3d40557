"""The fault suite: default options, zero false alarms, exact blame, every direction."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.fault_suite.models import BUGS, BUILDERS, inputs  # noqa: E402

DIRECTIONS = [("torch", "paddle"), ("paddle", "torch"), ("torch", "torch"), ("paddle", "paddle")]


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS)
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_equivalent_pairs_pass_with_defaults(bfw, rfw, kind):
    result = nbdiff.auto_diff(BUILDERS[kind](bfw), BUILDERS[kind](rfw), inputs(kind))
    assert result, result.report()


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS[:2])
def test_larger_cnn_bias_gradients_before_batchnorm_pass(bfw, rfw):
    # Regression: a conv bias gradient in front of BatchNorm is an exact zero summed from
    # 32x32x32 terms; its rounding noise was flagged until the tolerance counted the terms.
    x = np.random.RandomState(0).randn(32, 3, 32, 32).astype("float32")
    result = nbdiff.auto_diff(BUILDERS["cnn"](bfw), BUILDERS["cnn"](rfw), x)
    assert result, result.report()


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS)
@pytest.mark.parametrize("kind,bug", sorted(BUGS))
def test_bug_is_blamed_exactly(bfw, rfw, kind, bug):
    result = nbdiff.auto_diff(BUILDERS[kind](bfw), BUILDERS[kind](rfw, bug), inputs(kind))
    d = result.first_divergence
    assert d is not None, result.report()
    phase, path, where = BUGS[(kind, bug)]
    assert (d.phase.value, d.base_path, d.where) == (phase, path, where), result.report()
    assert d.step == 0
    if where == "layer":
        assert not d.inherited
        assert d.local_error is not None and d.local_error.ratio > 1


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS)
def test_optimizer_bug_blames_the_parameter(bfw, rfw):
    base, raw = BUILDERS["mlp"](bfw), BUILDERS["mlp"](rfw)

    def opt(fw, model, slow_fc2):
        if fw == "torch":
            groups = [
                {"params": model.fc2.parameters(), "lr": 0.11 if slow_fc2 else 0.1},
                {"params": [p for n, p in model.named_parameters() if not n.startswith("fc2.")]},
            ]
            return torch.optim.SGD(groups, lr=0.1)
        rest = [p for n, p in model.named_parameters() if not n.startswith("fc2.")]
        groups = [{"params": model.fc2.parameters(), "learning_rate": 1.1 if slow_fc2 else 1.0}, {"params": rest}]
        return paddle.optimizer.SGD(learning_rate=0.1, parameters=groups)

    result = nbdiff.auto_diff(
        base, raw, inputs("mlp"), optimizers=[opt(bfw, base, False), opt(rfw, raw, True)], steps=3
    )
    d = result.first_divergence
    assert d is not None and d.phase.value == "optimizer" and d.where == "parameter", result.report()
    assert d.base_path == "fc2" and d.parameter in ("fc2.weight", "fc2.bias")
    assert d.step == 0


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS[:2])
def test_training_steps_equivalent(bfw, rfw):
    base, raw = BUILDERS["mlp"](bfw), BUILDERS["mlp"](rfw)

    def opt(fw, model):
        if fw == "torch":
            return torch.optim.Adam(model.parameters(), lr=1e-3)
        return paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())

    result = nbdiff.auto_diff(base, raw, inputs("mlp"), optimizers=[opt(bfw, base), opt(rfw, raw)], steps=3)
    assert result, result.report()
    assert result.steps == 3
    assert len(result.select(phase="optimizer")) == 3 * 4


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS[:2])
@pytest.mark.parametrize("bug", ["act", "weight", "eps"])
def test_single_step_blames_the_layer(bfw, rfw, bug):
    result = nbdiff.auto_diff(BUILDERS["mlp"](bfw), BUILDERS["mlp"](rfw, bug), inputs("mlp"), single_step=True)
    d = result.first_divergence
    assert d is not None and d.base_path == BUGS[("mlp", bug)][1], result.report()


def test_single_step_equivalent_passes():
    result = nbdiff.auto_diff(BUILDERS["mlp"]("paddle"), BUILDERS["mlp"]("torch"), inputs("mlp"), single_step=True)
    assert result, result.report()


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS)
def test_api_level_names_the_functional_call(bfw, rfw):
    result = nbdiff.auto_diff(BUILDERS["mlp"](bfw), BUILDERS["mlp"](rfw, "functional"), inputs("mlp"), api_level=True)
    d = result.first_divergence
    assert (d.where, d.base_path, d.raw_path) == ("api", "::gelu", "::relu"), result.report()
    assert "API call `gelu` in the code of `<root>` (raw calls `relu`)" in d.describe()
    assert any(f.filename.endswith("models.py") for f in d.base_stack)


@pytest.mark.parametrize("bfw,rfw", DIRECTIONS)
@pytest.mark.parametrize("kind,bug", sorted(k for k in BUGS if k[1] != "functional"))
def test_api_level_keeps_the_layer_blame(bfw, rfw, kind, bug):
    result = nbdiff.auto_diff(BUILDERS[kind](bfw), BUILDERS[kind](rfw, bug), inputs(kind), api_level=True)
    phase, path, _ = BUGS[(kind, bug)]
    d = result.first_divergence
    assert d is not None and (d.phase.value, d.base_path.split("::")[0]) == (phase, path), result.report()


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_api_level_equivalent_pairs_pass(kind):
    for bfw, rfw in DIRECTIONS[:2]:
        result = nbdiff.auto_diff(BUILDERS[kind](bfw), BUILDERS[kind](rfw), inputs(kind), api_level=True)
        assert result, result.report()


def test_api_level_all_records_inside_framework_layers():
    kept = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp"), api_level=True)
    inside = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp"), api_level="all")
    assert kept and inside
    assert not any(e.base.path.startswith("fc1::") for e in kept.events)
    assert any(e.base.path == "fc1::linear" for e in inside.events)
