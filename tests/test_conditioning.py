"""Conditioning: rounding amplified by the model itself is not a divergence; real bugs still are."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.engine.conditioning import MARGIN, Noise, _nudged  # noqa: E402
from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.judge.metrics import compare_tensors  # noqa: E402
from nbdiff.judge.tolerance import resolve_tolerance  # noqa: E402
from nbdiff.trace.events import Event, Kind, Phase  # noqa: E402
from tests.zoo.pairs import _seed  # noqa: E402
from tests.zoo.vision import ResNet18  # noqa: E402

X = np.random.RandomState(0).randn(2, 3, 32, 32).astype("float32")


def _resnets():
    _seed()
    return ResNet18(10), paddle.vision.models.resnet18(num_classes=10)


def test_train_mode_batchnorm_over_two_values_is_conditioning_not_a_divergence():
    # At 32 px and batch 2, layer4's BatchNorms normalise 2 values per channel: the rounding of
    # two frameworks grows 8-170x past tolerance. Base itself moves as much from one ulp of input.
    base, raw = _resnets()
    result = nbdiff.auto_diff(base, raw, X)
    assert result, result.report()
    assert any("amplifies rounding" in w for w in result.warnings)


@pytest.mark.parametrize("where", ["layer1.0.bn1", "layer4.0.bn1"])
def test_a_real_bug_is_still_blamed_where_rounding_is_amplified(where):
    base, raw = _resnets()
    layer = raw
    for part in where.split("."):
        layer = getattr(layer, part) if not part.isdigit() else layer[int(part)]
    layer._epsilon = 1e-3
    d = nbdiff.auto_diff(base, raw, X).first_divergence
    assert d is not None and d.base_path == where


def test_only_floating_inputs_are_nudged_and_by_one_ulp():
    fw = framework_of(torch.nn.Linear(2, 2), "m")
    ids = ((torch.tensor([[1, 2]]),), {})
    assert _nudged(fw, ids, 0) is None
    x = torch.ones(1000)
    (moved,), _ = _nudged(fw, ((x,), {}), 0)
    change = (moved - x).abs()
    assert 0 < float(change.max()) <= float(np.finfo(np.float32).eps)


def _event():
    return Event(0, Phase.FORWARD, Kind.LAYER, 0, "fc", "Linear", 0, 1, None, True, (), ())


def test_noise_explains_only_errors_within_the_margin_and_measures_once():
    calls = []
    tol = resolve_tolerance(None, None, "float32")
    small = compare_tensors("out", np.array([1.0 + 3e-4]), np.array([1.0]), tol)
    large = compare_tensors("out", np.array([1.0 + 1e-2]), np.array([1.0]), tol)
    noise = Noise(lambda: calls.append(1) or {("forward", "layer", "fc", 0): 1e-4})
    assert not small.passed and noise(_event(), (small,))  # 3e-4 <= 4 x 1e-4
    assert not noise(_event(), (large,))
    assert 1e-2 > MARGIN * 1e-4 and len(calls) == 1 and len(noise.dismissed) == 1
    unknown = Noise(lambda: None)
    assert not unknown(_event(), (small,))
