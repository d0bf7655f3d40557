from dataclasses import fields

import numpy as np
import pytest

from nbdiff.judge import bulk
from nbdiff.judge.bulk import Comparisons
from nbdiff.judge.metrics import TensorDiff, compare_tensors
from nbdiff.judge.tolerance import Tolerance, resolve_tolerance

_SCALED = resolve_tolerance(None, None, "float32")
_PLAIN = Tolerance(1e-4, 1e-3)


def _pairs() -> list[tuple[str, np.ndarray, np.ndarray, Tolerance, float, bool]]:
    """One of every kind a step's comparisons hold, each kind in both tolerances, with and without hints."""
    rng = np.random.RandomState(0)
    out = []
    for tol in (_SCALED, _PLAIN):
        for hint, covers in ((0.0, False), (3.0, False), (5.0, True)):
            b = rng.randn(16, 32).astype("float32")
            inf = b.copy()
            inf[0, 0] = np.inf
            nan = b.copy()
            nan[1, 2] = np.nan
            masked = b.copy()
            masked[0, :3] = -np.inf
            masked_raw = masked.copy()
            masked_raw[0, :3] = -1e9
            tiny = np.zeros((4, 4), "float32")
            tiny_raw = tiny.copy()
            tiny_raw[2, 2] = 1e-30
            out += [
                ("same", b.copy(), b, tol, hint, covers),
                ("rounding", b + np.float32(1e-7) * rng.randn(16, 32).astype("float32"), b, tol, hint, covers),
                ("near", b * np.float32(1 + 2e-5), b, tol, hint, covers),  # beyond atol, maybe within rtol
                ("off", b + 1.0, b, tol, hint, covers),
                ("inf alike", inf.copy(), inf, tol, hint, covers),
                ("inf apart", b.copy(), inf, tol, hint, covers),
                ("nan", nan.copy(), nan, tol, hint, covers),
                ("mask", masked_raw, masked, tol, hint, covers),
                ("zeros", tiny_raw, tiny, tol, hint, covers),
                ("f64", b.astype("float64") + 1e-9, b.astype("float64"), tol, hint, covers),
                ("dtypes", b.astype("float64"), b, tol, hint, covers),
                ("shapes", b[:1], b, tol, hint, covers),
                ("scalar", np.float32(1.5), np.float32(1.5), tol, hint, covers),
                ("empty", np.zeros((0, 3), "float32"), np.zeros((0, 3), "float32"), tol, hint, covers),
                ("ints", np.arange(6), np.arange(6), tol, hint, covers),
                ("large", np.ones((300, 300), "float32"), np.ones((300, 300), "float32"), tol, hint, covers),
                ("strided", b.T, b.T.copy(), tol, hint, covers),
            ]
    return out


def _state(t: TensorDiff) -> dict:
    """Every field as read (deferred ones computed), and whether they were deferred."""
    return {"lazy": t.__dict__.get("detail") is not None, **{f.name: getattr(t, f.name) for f in fields(t)}}


def _same(x: object, y: object) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and np.isnan(x) and np.isnan(y))


@pytest.mark.parametrize("chunk", [1 << 20, 600])  # 600: the pairs decided over several passes
@pytest.mark.parametrize("mode", ["strict", "mean"])
def test_comparisons_made_together_are_those_made_one_by_one(monkeypatch, chunk, mode):
    monkeypatch.setattr(bulk, "_CHUNK", chunk)
    pairs = _pairs()
    batch = Comparisons(mode)
    for p in pairs:
        batch.add(*p)
    together = batch.made()
    alone = [compare_tensors(n, r, b, tol, mode, hint, True, covers) for n, r, b, tol, hint, covers in pairs]
    assert len(together) == len(alone) == len(pairs)
    for t, a in zip(together, alone):
        st, sa = _state(t), _state(a)
        assert st.keys() == sa.keys()
        for key in st:
            if key == "detail":
                continue
            assert _same(st[key], sa[key]), (t.name, key, st[key], sa[key])
    assert len(batch) == 0  # made once: the batch is empty again


def test_most_pairs_of_a_step_are_decided_together_and_only_the_rest_alone(monkeypatch):
    alone: list[str] = []
    real = bulk.compare_tensors

    def counted(name, *args, **kwargs):
        alone.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(bulk, "compare_tensors", counted)
    batch = Comparisons("strict")
    rng = np.random.RandomState(1)
    for i in range(20):
        b = rng.randn(8, 8).astype("float32")
        batch.add(f"t{i}", b + (1.0 if i == 7 else 0.0), b, _SCALED)
    made = batch.made()
    assert alone == ["t7"]  # the one beyond atol: its full metrics
    assert [t.passed for t in made] == [i != 7 for i in range(20)]


def test_a_comparison_made_elsewhere_keeps_its_place():
    made_elsewhere = compare_tensors("by stats", np.ones(3, "float32"), np.ones(3, "float32") * 2, _PLAIN)
    batch = Comparisons("strict")
    b = np.ones((2, 2), "float32")
    for i in range(10):
        batch.add(f"t{i}", b, b, _PLAIN)
        if i == 4:
            batch.put(made_elsewhere)
    names = [t.name for t in batch.made()]
    assert names == [f"t{i}" for i in range(5)] + ["by stats"] + [f"t{i}" for i in range(5, 10)]


def test_magnitudes_read_together_are_those_read_one_by_one():
    from nbdiff.engine.replay import array_magnitude, read_magnitudes
    from nbdiff.judge.bulk import largest_magnitudes

    rng = np.random.RandomState(2)
    nan = rng.randn(5).astype("float32")
    nan[2] = np.nan
    inf = -np.abs(rng.randn(3, 3))
    inf[1, 1] = -np.inf
    arrays = [rng.randn(4, 4).astype("float32") for _ in range(10)] + [
        nan, inf, -np.abs(rng.randn(7)), rng.randn(3).astype("float16"), np.zeros((0, 2), "float32"),
        np.arange(4), np.full((300, 300), -2.0, "float32"), np.float32(3.0) * np.ones(()), rng.randn(6, 2).T,
    ]  # fmt: skip
    found = largest_magnitudes(arrays)
    assert found[0] is not None and found[10] is None  # NaN: read alone
    for a, m in zip(arrays, found):
        if m is not None:
            assert m == array_magnitude(a)
    cache: dict = {}
    read_magnitudes(arrays + arrays[:3], cache)  # an array given twice is read once
    assert len(cache) == sum(m is not None for m in found)
    assert all(cache[id(a)][1] == array_magnitude(a) for a, m in zip(arrays, found) if m is not None)


def test_what_waits_is_decided_once_a_chunk_of_elements_waits_and_each_pair_is_told_then(monkeypatch):
    monkeypatch.setattr(bulk, "_CHUNK", 100)
    told: list[int] = []
    batch = Comparisons("strict")
    b = np.ones(30, "float32")
    for i in range(10):
        batch.add(f"t{i}", b, b, _PLAIN)
        batch.when_decided(lambda i=i: told.append(i))
    assert told == [0, 1, 2, 3, 4, 5, 6, 7]  # decided at 120 and 240 elements waiting
    assert len(batch) == 10 and [t.name for t in batch.made()] == [f"t{i}" for i in range(10)]
    assert told == list(range(10))


def test_a_step_lets_go_of_the_pages_it_read_as_it_compares_not_at_its_end(monkeypatch):
    # A recording past its memory budget is read from a file: each pair of events is told read once
    # compared, so its pages can go. Told only at the step's end, a 2,000-layer auto_diff held 130 MiB more.
    import torch

    import nbdiff
    from nbdiff.engine.live.comparer import LiveComparer

    monkeypatch.setattr(bulk, "_CHUNK", 64)
    log: list[str] = []
    real_add = Comparisons.add
    monkeypatch.setattr(Comparisons, "add", lambda self, *a, **k: (log.append("add"), real_add(self, *a, **k))[1])
    monkeypatch.setattr(LiveComparer, "read", lambda self, b, r: log.append("read"))
    torch.manual_seed(0)
    base = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(12)])
    raw = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(12)])
    assert nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(4, 8).astype("float32"))
    # Each comparison pass (forward, backward) reads its pairs as it goes, between its adds; read only at
    # each pass's end, a read would be followed by an add once per pass.
    assert log.count("read") >= 24
    assert sum(a == "read" and b == "add" for a, b in zip(log, log[1:])) >= 12


def _answers(result) -> tuple:
    """Everything a user reads of a result: its report, the step chart's rows, the first divergence."""
    d = result.first_divergence
    where = None if d is None else (d.phase.value, d.base_path, d.where, d.step, repr(d.local_error))
    return result.report(), result.step_errors(), where


@pytest.mark.parametrize("case", [("mlp", None), ("cnn", "eps"), ("mlp", "backward"), ("transformer", "act")])
def test_a_check_answers_the_same_with_its_comparisons_made_together_or_one_by_one(monkeypatch, case):
    import paddle
    import torch

    import nbdiff
    from tests.fault_suite.models import BUILDERS, inputs

    kind, bug = case
    answers = []
    for at_once in (bulk._AT_ONCE, 10**9):  # 10**9: every pair compared alone, as before
        monkeypatch.setattr(bulk, "_AT_ONCE", at_once)
        torch.manual_seed(0)
        paddle.seed(0)
        base, raw = BUILDERS[kind]("torch"), BUILDERS[kind]("paddle", bug) if bug else BUILDERS[kind]("paddle")
        answers.append(_answers(nbdiff.auto_diff(base, raw, inputs(kind))))
    assert answers[0] == answers[1]


def test_a_watched_loop_answers_the_same_with_its_comparisons_made_together_or_one_by_one(monkeypatch):
    # Several steps: updates and the gradient spreads too, with a learning rate apart on one layer.
    import paddle
    import torch

    import nbdiff
    from tests.fault_suite.models import BUILDERS, inputs

    x = inputs("mlp")
    answers = []
    for at_once in (bulk._AT_ONCE, 10**9):
        monkeypatch.setattr(bulk, "_AT_ONCE", at_once)
        torch.manual_seed(0)
        paddle.seed(0)
        base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
        topt = torch.optim.SGD(base.parameters(), lr=0.1)
        rest = [p for n, p in raw.named_parameters() if not n.startswith("fc2.")]
        groups = [{"params": raw.fc2.parameters(), "learning_rate": 1.5}, {"params": rest}]
        popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=groups)
        with nbdiff.watch(base, raw) as w:
            for _ in range(4):
                base(torch.tensor(x)).square().mean().backward()
                topt.step()
                topt.zero_grad()
                raw(paddle.to_tensor(x)).square().mean().backward()
                popt.step()
                popt.clear_grad()
        answers.append(_answers(w.result))
    assert answers[0][2] is not None and answers[0][2][0] == "optimizer"
    assert answers[0] == answers[1]
