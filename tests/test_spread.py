import numpy as np
import pytest

from nbdiff.engine.training import updates
from nbdiff.engine.training.updates import GradientSpread
from nbdiff.judge import bulk


def _step(rng: np.random.RandomState, k: int) -> dict:
    """One step's gradients per layer key: base's and raw's, by name, of every kind a run holds."""
    w = rng.randn(16, 8).astype("float32")
    nan = rng.randn(4).astype("float32")
    nan[1] = np.nan
    grads = {
        "fc1": ({"weight": w, "bias": rng.randn(8).astype("float32")},
                {"weight": w + np.float32(1e-6), "bias": rng.randn(8).astype("float32")}),
        "fc2": ({"weight": rng.randn(3, 3), "bias": nan}, {"weight": rng.randn(3, 3), "bias": nan[::-1].copy()}),
        "half": ({"w": rng.randn(5).astype("float16")}, {"w": rng.randn(5).astype("float16")}),
        # its shape changes at step 2: no spread from then on
        "grown": ({"w": rng.randn(3 if k < 2 else 4).astype("float32")}, {"w": rng.randn(3 if k < 2 else 4).astype("float32")}),
        "apart": ({"w": rng.randn(6).astype("float32")}, {"w": rng.randn(2, 3).astype("float32")}),
    }  # fmt: skip
    for i in range(12):  # enough parameters for several passes when the chunk is small
        grads[f"many.{i}"] = ({"w": rng.randn(7, 5).astype("float32")}, {"w": rng.randn(7, 5).astype("float32")})
    return grads


@pytest.mark.parametrize("chunk", [1 << 20, 100])
def test_spreads_widened_together_are_those_widened_one_by_one(monkeypatch, chunk):
    monkeypatch.setattr(bulk, "_CHUNK", chunk)
    rng = np.random.RandomState(0)
    together, alone = GradientSpread(), {}
    for k in range(4):
        grads = _step(rng, k)
        together.fold(grads)
        for key, (base, raw) in grads.items():  # the reference: each parameter alone, as before
            held = alone.setdefault(key, {})
            for name, bg in base.items():
                if name in raw and (name not in held or held[name] is not None):
                    held[name] = updates._widened(held.get(name), bg, raw[name])
    assert together.steps == 4
    for key, expected in alone.items():
        got = together.of(key)
        assert got.keys() == expected.keys(), key
        for name, e in expected.items():
            g = got[name]
            if e is None:
                assert g is None, (key, name)
                continue
            assert g is not None, (key, name)
            for x, y in zip(g[:2], e[:2]):
                assert x.shape == y.shape and x.dtype == y.dtype, (key, name)
                np.testing.assert_array_equal(x, y)
            assert g[2] == e[2] or (np.isnan(g[2]) and np.isnan(e[2])), (key, name)
    assert together.of("grown")["w"] is None and together.of("apart")["w"] is None
