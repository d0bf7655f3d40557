"""Tensors of paired events are compared by name, else by position; dumps by their statistics."""

import numpy as np
import pytest

from nbdiff.engine.forward import tensor_diffs
from nbdiff.judge.tolerance import resolve_tolerance
from nbdiff.trace.events import TensorRecord
from nbdiff.trace.stats import tensor_stats


def _tol(a, b):
    return resolve_tolerance(None, None, a, b)


def _rec(name, a, keep_value=True):
    return TensorRecord(name, a.shape, str(a.dtype), a if keep_value else None, None if keep_value else tensor_stats(a))


def test_tensors_pair_by_name_then_by_position():
    x, y = np.ones(8, "float32"), np.arange(8, dtype="float32")
    base = [_rec("out[0]", x), _rec("out[1]", y)]
    raw = [_rec("out[1]", y), _rec("out.extra", x * 2)]  # renamed: falls back to base's second tensor
    found = tensor_diffs(raw, base, _tol, "strict")
    assert [d.name for d in found] == ["out[1]", "out.extra"]
    assert found[0].passed and not found[1].passed


def test_statistics_only_records_are_compared_by_their_statistics():
    x = np.linspace(-1, 1, 64, dtype="float32")
    base, raw = [_rec("out", x, keep_value=False)], [_rec("out", x * 1.5, keep_value=False)]
    (d,) = tensor_diffs(raw, base, _tol, "strict")
    assert not d.passed
    (same,) = tensor_diffs(base, base, _tol, "strict")
    assert same.passed


@pytest.mark.parametrize("bf16_side", ["base", "raw"])
def test_bf16_torch_against_fp32_paddle_passes_at_bf16_precision(bf16_side):
    # Every layer passed, then <loss> was blamed: the loss (a float32 mean of bf16 outputs) and the
    # parameter gradients (bf16 read as float32 arrays) were judged at float32's tolerance.
    import nbdiff

    torch_ = pytest.importorskip("torch")
    paddle_ = pytest.importorskip("paddle")
    t = torch_.nn.Sequential(torch_.nn.Linear(16, 32), torch_.nn.Tanh(), torch_.nn.Linear(32, 4)).to(torch_.bfloat16)
    p = paddle_.nn.Sequential(paddle_.nn.Linear(16, 32), paddle_.nn.Tanh(), paddle_.nn.Linear(32, 4))
    x = np.random.RandomState(0).randn(8, 16).astype("float32")
    tx, px = torch_.from_numpy(x).to(torch_.bfloat16), paddle_.to_tensor(x)
    result = nbdiff.auto_diff(t, p, (tx, px)) if bf16_side == "base" else nbdiff.auto_diff(p, t, (px, tx))
    assert result, result.report()


@pytest.mark.parametrize("extra_on", ["raw", "base"])
def test_a_loss_blamed_because_the_outputs_differ_in_number_says_so(extra_on):
    # An extra output on one side blamed <loss> with nothing said about why.
    import nbdiff

    torch_ = pytest.importorskip("torch")
    paddle_ = pytest.importorskip("paddle")

    class T(torch_.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch_.nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return (y, y * 2) if extra_on == "base" else y

    class P(paddle_.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle_.nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return (y, y * 2) if extra_on == "raw" else y

    result = nbdiff.auto_diff(T(), P(), np.random.RandomState(0).randn(3, 4).astype("float32"))
    d = result.first_divergence
    counts = "1 (base) and 2 (raw)" if extra_on == "raw" else "2 (base) and 1 (raw)"
    assert d.base_path == "<loss>" and d.why().startswith(f"the models return {counts} floating outputs")
    assert "pass loss_fns" in result.report()


def test_tolerances_made_once_per_list_of_dtypes_are_those_made_each_time():
    from nbdiff.engine.forward import at_least_as_loose, loose_tols
    from nbdiff.judge.tolerance import resolve_tolerance

    def tol(a, b):
        return resolve_tolerance(None, None, a, b)

    loose = loose_tols(tol)
    for dtypes in (["float32"], ["bfloat16", "float32"], ["float16"], [], ["int64", "float64"], ["float32"]):
        for a, b in (("float32", "float32"), ("bfloat16", "float32"), ("float64", "float16")):
            assert loose(dtypes)(a, b) == at_least_as_loose(tol, dtypes)(a, b)
    assert loose(["float32"]) is loose(["float32"])  # made once
