"""The one whole step every verb compares (``StepComparer.whole_step``)."""

import numpy as np
import pytest

from nbdiff.engine.comparer import BeforeCompare, StepComparer, StepComparison, WholeStep

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402


class _Source:
    """A step source that says what it was asked, in order."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def before_compare(self, k, pairing, brec, rrec):
        self.asked.append("before")
        return BeforeCompare()

    def updates(self, k, pairing, brec, rrec, step):
        self.asked.append(f"updates after {len(step.diffs)} diffs")
        return StepComparison(notes=["u"])

    def state(self, k, brec, rrec):
        self.asked.append("state")
        return StepComparison(notes=["s"])


def test_a_whole_step_asks_its_source_in_the_order_every_verb_shares(monkeypatch):
    cmp = StepComparer(lambda a, b: None, "strict")
    seen = []
    monkeypatch.setattr(cmp, "pair", lambda b, r: ("pairing", ["paired"]))
    monkeypatch.setattr(cmp, "compare", lambda *a, **k: seen.append(a) or StepComparison(diffs=["d1", "d2"]))
    source = _Source()
    whole = cmp.whole_step(3, "brec", "rrec", source)
    assert source.asked == ["before", "updates after 2 diffs", "state"]
    assert whole.pairing == "pairing" and whole.notes == ["paired", "u", "s"] and whole.diffs == ["d1", "d2"]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


@pytest.mark.parametrize("verb", ["auto_diff", "watch", "record + compare"])
def test_every_verb_compares_each_step_through_the_one_whole_step(verb, monkeypatch, tmp_path):
    calls = []
    whole_step = StepComparer.whole_step

    def counted(self, k, *args, **kwargs) -> WholeStep:
        whole = whole_step(self, k, *args, **kwargs)
        calls.append((k, [type(p).__name__ for p in whole.parts]))
        return whole

    monkeypatch.setattr(StepComparer, "whole_step", counted)
    base, raw = _net(), _net()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (base, raw)]
    xs = [np.random.RandomState(i).randn(6, 4).astype("float32") for i in range(3)]
    if verb == "auto_diff":
        result = nbdiff.auto_diff(base, raw, xs[0], optimizers=opts, steps=3)
    elif verb == "watch":
        with nbdiff.watch(base, raw) as w:
            for x in xs:
                for m, o in zip((base, raw), opts):
                    m(torch.tensor(x)).sum().backward()
                    o.step()
                    o.zero_grad()
        result = w.result
    else:
        for m, o, d in zip((base, raw), opts, ("a", "b")):
            with nbdiff.record(m, tmp_path / d):
                for x in xs:
                    m(torch.tensor(x)).sum().backward()
                    o.step()
                    o.zero_grad()
        result = nbdiff.compare(tmp_path / "a", tmp_path / "b")
    assert result, result.report()
    assert [k for k, _ in calls] == [0, 1, 2]
