"""Fused layers paired by structure: the weights say that a raw ``qkv`` fuses base's ``q``, ``k``
and ``v``, so the weight copy needs no probe forward of the models."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
import nbdiff.weights.assign as assign_module  # noqa: E402
from nbdiff.align.fused_structure import out_features  # noqa: E402
from nbdiff.frameworks import framework_of  # noqa: E402
from tests.test_fused import PAIRS, REVERSED, X, _torch_fused, _torch_sep  # noqa: E402

BOTH = {**PAIRS, **REVERSED}


def _params(model):
    fw = framework_of(model, "m")
    return {n: fw.to_numpy(p).copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("direction", list(BOTH))
def test_fused_layers_are_paired_from_their_weights_as_a_run_pairs_them(direction, monkeypatch):
    # Without inputs, assign_weight refused ("base has 6 layers with weights, raw has 3"), and auto_diff
    # ran both models once more (a no-grad probe) to pair them: a third of its time on a fused LLM.
    make_base, make_raw = BOTH[direction]
    base, raw = make_base(), make_raw()
    wmap = nbdiff.assign_weight(base, raw)
    assert {g.path for g in wmap.fused} & {"q+k+v", "gate_proj+up_proj"} and not wmap.warnings
    by_run_raw = make_raw()
    nbdiff.assign_weight(base, by_run_raw, inputs=X)
    mine, theirs = _params(raw), _params(by_run_raw)
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[n], theirs[n]) for n in mine)

    def no_probe(*args, **kwargs):
        raise AssertionError("a probe forward ran")

    monkeypatch.setattr(assign_module, "pair_once", no_probe)
    result = nbdiff.auto_diff(make_base(), make_raw(), X)
    assert result, result.report()


def test_layers_whose_features_do_not_add_up_are_not_fused_by_structure():
    base, raw = _torch_sep(), _torch_fused()
    raw.qkv = torch.nn.Linear(8, 20)  # 20 != 8 + 4 + 4
    with pytest.raises(nbdiff.NbdiffError, match="Cannot pair the layers by structure"):
        nbdiff.assign_weight(base, raw)


def test_out_features_of_a_linear_as_each_framework_lays_its_weight_out():
    torch_fw, paddle_fw = framework_of(torch.nn.Linear(3, 5), "t"), framework_of(paddle.nn.Linear(3, 5), "p")
    assert out_features(torch_fw, torch.nn.Linear(3, 5)) == 5
    assert out_features(paddle_fw, paddle.nn.Linear(3, 5)) == 5
    assert out_features(paddle_fw, paddle.nn.Linear(3, 5, bias_attr=False)) == 5
    assert out_features(torch_fw, torch.nn.Conv2d(3, 5, 1)) is None
