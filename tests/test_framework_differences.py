"""Known framework differences as data: each verifies exactly, and explains nothing else."""

import numpy as np

from nbdiff.judge.framework_differences import StateUpdate, explaining, momentum_of


def _update(base_fw, raw_fw, momentum=0.1, n=8):
    rng = np.random.RandomState(0)
    before = rng.rand(4).astype("float32") + 0.5
    batch = rng.rand(4) + 0.5  # base's batch variance, under base's rule
    after = ((1 - momentum) * before + momentum * batch).astype("float32")
    return StateUpdate(base_fw, raw_fw, "BatchNorm2d", "running_var", before, after, momentum, n), before, batch


def _close(a, b):
    return bool(np.allclose(a, b, rtol=1e-6, atol=0))


def test_biased_running_var_is_verified_exactly_both_ways():
    for base_fw, raw_fw, factor in (("torch", "paddle", 7 / 8), ("paddle", "torch", 8 / 7)):
        u, before, batch = _update(base_fw, raw_fw)
        raw = (0.9 * before + 0.1 * batch * factor).astype("float32")
        entry = explaining(u, raw, _close)
        assert entry is not None and entry.key == "batchnorm running_var"


def test_anything_else_stays_unexplained():
    u, before, batch = _update("torch", "paddle")
    wrong_momentum = (0.1 * before + 0.9 * batch * 7 / 8).astype("float32")
    assert explaining(u, wrong_momentum, _close) is None
    same_framework = StateUpdate("torch", "torch", *list(u.__dict__.values())[2:])
    assert explaining(same_framework, (0.9 * before + 0.1 * batch).astype("float32"), _close) is None
    not_the_variance = StateUpdate("torch", "paddle", "BatchNorm2d", "running_mean", *list(u.__dict__.values())[4:])
    assert explaining(not_the_variance, (0.9 * before + 0.1 * batch * 7 / 8).astype("float32"), _close) is None


def test_momentum_is_read_in_torchs_meaning():
    class TorchBN:
        momentum = 0.1

    class PaddleBN:
        _momentum = 0.9

    assert momentum_of("torch", TorchBN()) == 0.1
    assert abs(momentum_of("paddle", PaddleBN()) - 0.1) < 1e-12
    assert momentum_of("torch", object()) is None
