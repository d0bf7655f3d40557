"""nbdiff.compare on dumps: every step, every rank, statistics-only, and mismatched dumps."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import DumpError  # noqa: E402
from tests.dumps import X, momentum_pair, pair, record_training, train  # noqa: E402
from tests.fault_suite.models import BUILDERS  # noqa: E402


@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_equivalent_dumps_agree_over_every_step(tmp_path, base_fw, raw_fw):
    base, raw = pair(base_fw=base_fw, raw_fw=raw_fw)
    a, b = train(base, tmp_path / "a"), train(raw, tmp_path / "b")
    result = nbdiff.compare(a.parent, b.parent)
    assert result, result.report()
    assert result.steps == 3 and len(result.select(step=2, phase="optimizer")) == 4


def test_a_divergence_in_the_last_step_is_found(tmp_path):
    # PaDiff's offline compare checked step 0 only and answered True here.
    base, raw = pair()
    a, b = train(base, tmp_path / "a"), train(raw, tmp_path / "b", late_bug_at=2)
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert d is not None and (d.step, d.phase.value, d.base_path, d.where) == (2, "forward", "fc2", "layer")


@pytest.mark.parametrize("bug,phase,path", [("eps", "forward", "norm"), ("backward", "backward", "mid")])
def test_blame_without_replay(tmp_path, bug, phase, path):
    base, raw = pair(bug)
    a, b = train(base, tmp_path / "a", steps=1), train(raw, tmp_path / "b", steps=1)
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert (d.phase.value, d.base_path, d.where) == (phase, path, "layer")


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_one_bug_is_one_finding_and_says_why(tmp_path, base_fw, raw_fw, dump_type):
    # Offline used to add the root's own code (its inputs agree, so its whole error looked local) and
    # the backward of every layer after the bug (their gradients arriving agree, but a parameter's
    # gradient is also made of the forward inputs, which differed), and why() said nothing.
    base, raw = pair("eps", base_fw, raw_fw)
    a = train(base, tmp_path / "a", steps=2, dump_type=dump_type)
    b = train(raw, tmp_path / "b", steps=2, dump_type=dump_type)
    result = nbdiff.compare(a.parent, b.parent)
    first = result.first_divergence
    assert (first.phase.value, first.base_path, first.where) == ("forward", "norm", "layer")
    assert {(f.base_path, f.where) for f in result.findings} == {("norm", "layer")}  # its backward may show too
    assert "eps: base 1e-05, raw 0.001" in result.first_divergence.why()
    # Its local error is measured on a rebuilt layer where the dump holds values; never said as a replay.
    said = "rebuilt from its dump" if dump_type == "tensor" else "local        not measured"
    assert said in result.report() and "alone, run on the base side's inputs" not in result.report()


@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_bug_in_a_layers_own_code_between_its_sublayers_is_still_found(tmp_path, base_fw, raw_fw):
    base, raw = pair("functional", base_fw, raw_fw)
    a, b = train(base, tmp_path / "a", steps=1), train(raw, tmp_path / "b", steps=1)
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert (d.phase.value, d.base_path, d.where, d.between) == ("forward", "", "between", ("fc1", "norm"))


def test_optimizer_difference_names_a_parameter(tmp_path):
    base, raw = pair()
    a, b = train(base, tmp_path / "a", steps=1), train(raw, tmp_path / "b", steps=1, lr=0.11)
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert d.phase.value == "optimizer" and d.where == "parameter" and d.parameter.startswith(d.base_path + ".")


def test_statistics_dumps_are_compared_by_statistics(tmp_path):
    base, raw = pair()
    a = train(base, tmp_path / "a", steps=2, dump_type="statistics")
    b = train(raw, tmp_path / "b", steps=2, dump_type="statistics")
    assert nbdiff.compare(a.parent, b.parent)
    base, raw = pair("eps")
    a = train(base, tmp_path / "c", steps=1, dump_type="statistics")
    b = train(raw, tmp_path / "d", steps=1, dump_type="statistics")
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert d.base_path == "norm" and "statistics" in d.metrics.note


def test_every_rank_is_compared(tmp_path, monkeypatch):
    for rank, bug in ((0, None), (1, 2)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        base, raw = pair()
        train(base, tmp_path / "a", steps=3)
        train(raw, tmp_path / "b", steps=3, late_bug_at=bug)
    result = nbdiff.compare(tmp_path / "a", tmp_path / "b")
    d = result.first_divergence
    assert (d.rank, d.step, d.base_path) == (1, 2, "fc2")
    assert "rank 1" in d.describe()
    assert {e.base.rank for e in result.events} == {0, 1}


def test_mismatched_dumps(tmp_path, monkeypatch):
    base, raw = pair()
    a = train(base, tmp_path / "a", steps=3)
    b = train(raw, tmp_path / "b", steps=2)
    with pytest.raises(DumpError, match="3 step\\(s\\).*2"):
        nbdiff.compare(a.parent, b.parent)
    result = nbdiff.compare(a.parent, b.parent, ignore_unmatched=True)
    assert result.steps == 2 and result.warnings
    monkeypatch.setenv("RANK", "1")
    train(raw, tmp_path / "c", steps=3)
    with pytest.raises(DumpError, match="ranks \\[0\\] but .* has \\[1\\]"):
        nbdiff.compare(a.parent, tmp_path / "c")


def test_api_level_dumps_name_the_call(tmp_path):
    base, raw = pair("functional")
    a = train(base, tmp_path / "a", steps=1, api_level=True)
    b = train(raw, tmp_path / "b", steps=1, api_level=True)
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert (d.where, d.base_path, d.raw_path) == ("api", "::gelu", "::relu")


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
def test_comparing_many_steps_holds_a_bounded_number_of_steps(tmp_path, dump_type):
    import tracemalloc

    def peak(steps):
        base, raw = pair()
        a = train(base, tmp_path / f"a{steps}", steps=steps, dump_type=dump_type)
        b = train(raw, tmp_path / f"b{steps}", steps=steps, dump_type=dump_type)
        tracemalloc.start()
        try:
            result = nbdiff.compare(a, b)
            return tracemalloc.get_traced_memory()[1], result
        finally:
            tracemalloc.stop()

    small, _ = peak(6)
    large, result = peak(48)
    assert result and result.steps == 48
    # Before: every step's settled events, and every step file's JSON while checking (4-8x for 8x the steps).
    assert large < 1.6 * small, (small, large)
    assert [r["step"] for r in result.step_errors()] == list(range(48))
    assert {d.base.step for d in result.events} == {0, 1, 2, 3}
    for d in result.events:  # steps that agree keep metrics and statistics, not tensors
        assert all(t.value is None for t in d.base.outputs + d.raw.outputs)
        assert all(t.stats is not None for t in d.base.outputs)
    assert all(t.ratio <= 1 for d in result.events for t in d.tensors)
    assert any("44 step(s) from step 4 on are summarised" in n and "keep_steps=48" in n for n in result.notes)


def test_a_late_divergence_keeps_its_step_whole_and_every_step_its_worst_errors(tmp_path):
    base, raw = pair()
    a = train(base, tmp_path / "a", steps=12)
    b = train(raw, tmp_path / "b", steps=12, late_bug_at=9)
    result = nbdiff.compare(a, b, keep_steps=2)
    d = result.first_divergence
    assert (d.step, d.base_path) == (9, "fc2")
    # The first 2 steps, the blamed one and 2 on either side of it (AROUND).
    assert sorted({e.base.step for e in result.events}) == [0, 1, 7, 8, 9, 10, 11]
    blamed = [e for e in result.events if e.base.step == 9 and e.base.path == "fc2"]
    assert blamed and blamed[0].base.outputs[0].value is not None  # the view can plot the blamed tensors
    rows = result.step_errors()
    assert [r["step"] for r in rows] == list(range(12))
    assert all(r["outputs"] <= 1 for r in rows[:9]) and all(r["outputs"] > 1 for r in rows[9:])
    assert any("keep_steps=7" in n for n in result.notes)  # steps 2 to 6 are summarised
    everything = nbdiff.compare(a, b, keep_steps=12)
    assert sorted({e.base.step for e in everything.events}) == list(range(12)) and not everything.notes
    assert everything.step_errors() == rows


def test_a_layer_unpaired_in_every_step_is_listed_once(tmp_path):
    import torch

    base, raw = pair(base_fw="torch", raw_fw="torch")
    raw.extra = torch.nn.Identity()
    inner = raw.forward
    raw.forward = lambda x: raw.extra(inner(x))
    result = nbdiff.compare(train(base, tmp_path / "a", steps=5), train(raw, tmp_path / "b", steps=5))
    assert [e.path for e in result.unmatched_raw] == ["extra"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_keep_steps_must_be_a_whole_number(tmp_path, bad):
    from nbdiff.errors import OptionError

    with pytest.raises(OptionError, match="keep_steps"):
        nbdiff.compare(tmp_path, tmp_path, keep_steps=bad)


def test_an_adam_update_that_gradients_at_rounding_noise_explain_is_no_divergence(tmp_path):
    torch = pytest.importorskip("torch")

    from tests.test_drift import models_with_a_noisy_gradient

    x = torch.tensor(np.random.RandomState(1).randn(32, 8).astype("float32"))
    paths = []
    for name, model in zip("ab", models_with_a_noisy_gradient(flip=True)):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        with nbdiff.record(model, tmp_path / name) as rec:
            model(x).pow(2).mean().backward()
            opt.step()
        paths.append(rec.path)
    result = nbdiff.compare(*paths)
    assert result, result.report()
    (update,) = [t for d in result.select(step=0, phase="optimizer") for t in d.tensors if t.note]
    assert update.note.startswith("1 element(s) differ by what the gradients")


def test_each_steps_gradients_are_read_once_however_many_updates_they_explain(tmp_path, monkeypatch):
    # Every step's update needed the gradients of all the steps before it, and read them all again:
    # a long dump's comparison grew with the square of its length (and held every step read).
    torch = pytest.importorskip("torch")

    from nbdiff.engine.recorded import comparer as recorded
    from tests.test_drift import models_with_a_noisy_gradient

    x = torch.tensor(np.random.RandomState(1).randn(32, 8).astype("float32"))
    steps, paths = 4, []
    for name, model in zip("ab", models_with_a_noisy_gradient(flip=True)):
        opt = torch.optim.Adam(model.parameters(), lr=1e-7)  # small: the flipped element's drift stays invisible
        with nbdiff.record(model, tmp_path / name) as rec:
            for _ in range(steps):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        paths.append(rec.path)
    reads = []
    real = recorded.step_param_grads
    monkeypatch.setattr(recorded, "step_param_grads", lambda *a: reads.append(1) or real(*a))
    result = nbdiff.compare(*paths)
    assert result, result.report()
    explained = {d.base.step for d in result.events if d.base.phase.value == "optimizer" for t in d.tensors if t.note}
    assert explained == set(range(steps))  # every step's update was redone with the gradients so far
    assert len(reads) == 2 * steps  # each step, each side: once


def _attention_dumps(tmp_path, dump_type, grad_bug=None):
    """One step of the fault suite's transformer block, torch and paddle, recorded; ``grad_bug``
    scales the gradient of one of paddle's attention projections (a backward-only bug)."""
    import paddle
    import torch

    from tests.fault_suite.models import BUILDERS, inputs

    x = inputs("transformer")
    base, raw = BUILDERS["transformer"]("torch"), BUILDERS["transformer"]("paddle")
    nbdiff.assign_weight(base, raw, inputs=x)
    if grad_bug is not None:
        getattr(raw.attn, grad_bug).weight.register_hook(lambda g: g * 1.01)
    paths = []
    for model, tensor in ((base, torch.tensor), (raw, paddle.to_tensor)):
        with nbdiff.record(model, tmp_path / f"{len(paths)}", dump_type=dump_type) as rec:
            model(tensor(np.asarray(x))).mean().backward()
        paths.append(rec.path)
    return paths


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
def test_equivalent_attention_dumps_agree(tmp_path, dump_type):
    # torch splits nothing; paddle's q/k/v projections are pieces of torch's in_proj: statistics
    # of a piece are not the whole's (a false alarm once the attention's gradients were compared)
    result = nbdiff.compare(*_attention_dumps(tmp_path, dump_type))
    assert result, result.report()


@pytest.mark.parametrize(
    "dump_type,grad_bug", [("tensor", "out_proj"), ("tensor", "q_proj"), ("statistics", "out_proj")]
)
def test_a_backward_only_bug_in_an_attention_projection_is_blamed_on_the_attention(tmp_path, dump_type, grad_bug):
    # torch's MultiheadAttention uses out_proj's weights without calling it, and paddle's
    # projections are sublayers: the dumps compared no attention gradient and said SUCCESS.
    d = nbdiff.compare(*_attention_dumps(tmp_path, dump_type, grad_bug)).first_divergence
    assert d is not None and (d.phase.value, d.base_path, d.raw_path) == ("backward", "attn", "attn")


@pytest.mark.parametrize(("name", "bad"), [("atol", float("nan")), ("atol", float("inf")), ("rtol", -1), ("atol", "1")])
def test_tolerances_are_checked_at_the_door(tmp_path, name, bad):
    # rtol=-1 or atol=inf gave SUCCESS on a real divergence.
    from nbdiff.errors import OptionError

    with pytest.raises(OptionError, match=name):
        nbdiff.compare(tmp_path, tmp_path, **{name: bad})
    with pytest.raises(OptionError, match="compare_mode"):
        nbdiff.compare(tmp_path, tmp_path, compare_mode="loose")


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_the_same_nan_in_both_runs_is_a_finding_not_agreement(tmp_path, direction):
    # A NaN weight copied into both: both runs agree NaN for NaN, and compare said SUCCESS where
    # auto_diff names the layer that produces it.
    bfw, rfw = direction.split("->")
    base, raw = pair(base_fw=bfw, raw_fw=rfw)
    from tests.structure_models import put_nan

    for model in (base, raw):
        put_nan(model.fc1.weight)
    result = nbdiff.compare(train(base, tmp_path / "a", steps=1), train(raw, tmp_path / "b", steps=1))
    d = result.first_divergence
    assert d is not None and (d.where, d.base_path) == ("nonfinite", "fc1"), result.report()


def _tight_batchnorm(fw: str, eps: float = 1e-5):
    """Linear, train-mode BatchNorm1d, Tanh, Linear over a batch of 2 whose values sit near 100 with a
    spread of about 1e-3: the BatchNorm divides rounding differences by that spread."""
    if fw == "torch":
        import torch

        torch.manual_seed(7)
        nn = torch.nn
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16, eps=eps), nn.Tanh(), nn.Linear(16, 4))
    else:
        import paddle

        paddle.seed(7)
        nn = paddle.nn
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1D(16, epsilon=eps), nn.Tanh(), nn.Linear(16, 4))
    w, b = model[0].weight, model[0].bias
    if fw == "torch":
        with torch.no_grad():
            w.mul_(0.01)
            b.add_(100.0)
    else:
        w.set_value(w.numpy() * 0.01)
        b.set_value(b.numpy() + 100.0)
    return model.train()


def _recorded_pair(tmp_path, base, raw, x, dump_type="tensor"):
    """``nbdiff.compare`` of one step of each model on ``x``, recorded as ``dump_type``."""
    from nbdiff.engine.stepping import loss_of
    from nbdiff.frameworks import framework_of

    nbdiff.assign_weight(base, raw)
    paths = []
    for side, model in (("base", base), ("raw", raw)):
        fw = framework_of(model, side)
        with nbdiff.record(model, tmp_path / side, dump_type=dump_type) as rec:
            loss_of(fw, None, model(fw.from_numpy(x)), side).backward()
        paths.append(rec.path)
    return nbdiff.compare(*paths)


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
@pytest.mark.parametrize("eps", [1e-5, 1e-3], ids=["equivalent", "eps"])
def test_a_batchnorm_amplifying_rounding_is_recomputed_from_the_dump(tmp_path, base_fw, raw_fw, eps, dump_type):
    # Offline, the BatchNorm's inputs agree within tolerance and its outputs did not: it was blamed
    # on an equivalent pair. Recomputed (base's layer on raw's inputs), it is rounding; a real eps
    # difference still shows. A statistics dump keeps the values of such a BatchNorm (two per
    # channel): without them, the equivalent pair was blamed there.
    base, raw = _tight_batchnorm(base_fw), _tight_batchnorm(raw_fw, eps)
    x = np.random.RandomState(1).randn(2, 8).astype("float32")
    result = _recorded_pair(tmp_path, base, raw, x, dump_type)
    if eps == 1e-5:
        assert result, result.report()
    else:
        d = result.first_divergence
        assert (d.phase.value, d.base_path, d.where) == ("forward", "1", "layer") and "eps" in d.why()
        assert d.local_by == "recomputed" and "recomputed from the dump" in result.report()


def _shuffle_unit(fw: str, shuffles: bool):
    """Two branches concatenated, then (``shuffles``) their channels interleaved, as ShuffleNet does,
    before a head: a port that forgets the shuffle hands the head the same values in another order."""
    if fw == "torch":
        import torch

        torch.manual_seed(3)
        nn, cat = torch.nn, torch.cat
        base_class = nn.Module
    else:
        import paddle

        paddle.seed(3)
        nn, cat = paddle.nn, paddle.concat
        base_class = nn.Layer

    class Unit(base_class):
        def __init__(self):
            super().__init__()
            self.left, self.right, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(16, 4)

        def forward(self, x):
            y = cat([self.left(x), self.right(x)], -1)
            if shuffles:
                y = (
                    y.reshape([-1, 2, 8]).transpose([0, 2, 1])
                    if fw == "paddle"
                    else y.reshape(-1, 2, 8).transpose(1, 2)
                )
                y = y.reshape([-1, 16])
            return self.head(y)

    return Unit()


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_channels_left_unshuffled_are_blamed_on_the_code_that_shuffles(tmp_path, base_fw, raw_fw, dump_type):
    # Shuffling changes no statistic: a statistics dump blamed the head, whose input "agreed", for its
    # output. The values sampled at the same places of both sides' tensors show its input differing.
    x = np.random.RandomState(2).randn(4, 8).astype("float32")
    same = _recorded_pair(tmp_path / "same", _shuffle_unit(base_fw, True), _shuffle_unit(raw_fw, True), x, dump_type)
    assert same, same.report()
    result = _recorded_pair(tmp_path / "bug", _shuffle_unit(base_fw, True), _shuffle_unit(raw_fw, False), x, dump_type)
    d = result.first_divergence
    assert d is not None and (d.phase.value, d.base_path, d.where) == ("forward", "", "between"), result.report()
    if dump_type == "statistics":
        assert "sampled values" in result.report()


def _few_tight_channels(fw: str, tight: list[int]):
    """Linear(8, 256), train-mode BatchNorm1d, Tanh, Linear(256, 64) on a batch of 2: only the
    ``tight`` channels sit near 100 with a tiny spread, which the BatchNorm amplifies the rounding of."""
    model = _tight_batchnorm(fw)
    if fw == "torch":
        import torch

        nn = torch.nn
        model = nn.Sequential(nn.Linear(8, 256), nn.BatchNorm1d(256), nn.Tanh(), nn.Linear(256, 64))
    else:
        import paddle

        nn = paddle.nn
        model = nn.Sequential(nn.Linear(8, 256), nn.BatchNorm1D(256), nn.Tanh(), nn.Linear(256, 64))
    w, b = model[0].weight, model[0].bias
    at = (slice(None), tight) if fw == "paddle" else (tight,)  # paddle's Linear weight is [in, out]
    wv, bv = w.detach().numpy().copy(), b.detach().numpy().copy()
    wv[at] *= 0.01
    bv[tight] += 100.0
    if fw == "torch":
        with torch.no_grad():
            w.copy_(torch.tensor(wv))
            b.copy_(torch.tensor(bv))
    else:
        w.set_value(wv)
        b.set_value(bv)
    return model.train()


@pytest.mark.parametrize("bug", [False, True], ids=["equivalent", "bug after it"])
@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_rounding_amplified_in_channels_the_sample_misses_is_not_blamed_on_the_layer_that_mixes_them(
    tmp_path, base_fw, raw_fw, bug
):
    # The BatchNorm amplifies the rounding of 4 channels, none of which the Tanh's sampled values
    # look at; the last Linear mixes them into every value it makes, so its sample differs while
    # what it received "agreed": the equivalent pair was blamed on that Linear (and, in backward,
    # on the Tanh). A bug after the BatchNorm, far past what its rounding makes, is still found.
    from nbdiff.trace.stats import sample_positions

    seen = set((sample_positions(2 * 256) % 256).tolist())
    tight = [c for c in range(256) if c not in seen][:4]
    base, raw = _few_tight_channels(base_fw, tight), _few_tight_channels(raw_fw, tight)
    if bug:
        raw[3].forward = lambda x, own=raw[3].forward: own(x) * 1.5
    x = np.random.RandomState(1).randn(2, 8).astype("float32")
    result = _recorded_pair(tmp_path, base, raw, x, "statistics")
    if not bug:
        assert result, result.report()
    else:
        d = result.first_divergence
        assert d is not None and (d.phase.value, d.base_path) == ("forward", "3"), result.report()


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
@pytest.mark.parametrize("bug_in", ["paddle", "torch"])
@pytest.mark.parametrize("base_fw", ["torch", "paddle"])
def test_recorded_running_statistics_find_a_momentum_bug_and_note_the_framework_difference(
    tmp_path, dump_type, bug_in, base_fw
):
    # Dumps kept no running statistics: a BatchNorm momentum bug compared as SUCCESS, and the models'
    # eval outputs differed after the loop.
    for bug, folder in ((None, "ok"), (bug_in, "bug")):
        t, p = momentum_pair(bug)
        nbdiff.assign_weight(t, p)
        base, raw = (t, p) if base_fw == "torch" else (p, t)
        a = record_training(base, tmp_path / folder / "a", dump_type)
        b = record_training(raw, tmp_path / folder / "b", dump_type)
        result = nbdiff.compare(a, b)
        if bug is None:
            assert result, result.report()
            if dump_type == "tensor":  # verified from the values before and after; statistics cannot tell
                assert any(f.where == "framework" and f.base_path == "bn1" for f in result.findings), result.report()
        else:
            d = result.first_divergence
            assert d is not None and (d.step, d.phase.value, d.base_path) == (0, "state", "bn1"), result.report()


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
@pytest.mark.parametrize("written", ["base", "raw"])
def test_a_weight_written_outside_the_optimizer_is_found_as_that_write_offline(tmp_path, written, dump_type):
    # The port scales fc2's weight after step 1's update (clipping, an EMA): the dump keeps that it was
    # written outside the optimizer, so compare blames the write, not the update or a setting.
    base, raw = pair()

    import torch

    def scale(k, model):
        if k == 1:
            w = model.fc2.weight
            if hasattr(w, "set_value"):
                w.set_value(w.numpy() * 1.05)
            else:
                with torch.no_grad():
                    w.mul_(1.05)

    a = train(base, tmp_path / "a", steps=4, after_update=scale if written == "base" else None, dump_type=dump_type)
    b = train(raw, tmp_path / "b", steps=4, after_update=scale if written == "raw" else None, dump_type=dump_type)
    result = nbdiff.compare(a.parent, b.parent)
    d = result.first_divergence
    assert d is not None and (d.step, d.where, d.parameter) == (1, "outside", "fc2.weight"), result.report()
    assert f"{written}'s `fc2.weight` changed outside the optimizer" in d.describe(), d.describe()
    assert "norm x1.05" in d.describe() and not d.arguments


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
def test_updates_one_rounding_of_their_weights_apart_agree_offline(tmp_path, dump_type):
    # Weights near 1 moved by updates of 1e-6: a dump keeps each update as the difference of two weights
    # rounded to float32 (1.2e-7 apart), so an optimizer that rounds once more differs by that much.
    # With updates this small, some elements round differently on every machine. Its
    # floor is the weights' magnitude, which compare had only live: a 256-step SGD run of equivalent CNNs
    # false-alarmed on a BatchNorm's weight at step 108 (one rounding of 1.0, 1.7x its tolerance).
    import torch

    class HalvedSGD(torch.optim.Optimizer):  # the port's own SGD: each step applied in two halves
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.add_(p.grad, alpha=-group["lr"] / 2)
                    p.add_(p.grad, alpha=-group["lr"] / 2)

    rng = np.random.RandomState(0)
    w = torch.tensor(1.0 + 0.01 * rng.randn(16, 16).astype("float32"))
    x = torch.tensor(rng.randn(8, 16).astype("float32"))
    folders = []
    for name, make in (("a", torch.optim.SGD), ("b", HalvedSGD)):
        model = torch.nn.Linear(16, 16, bias=False)
        with torch.no_grad():
            model.weight.copy_(w)
        opt = make(model.parameters(), lr=1e-6)
        with nbdiff.record(model, tmp_path / name, dump_type=dump_type) as rec:
            for _ in range(4):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        folders.append(rec.path)
    result = nbdiff.compare(*folders)
    assert result, result.report()


@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_group_learning_rate_behind_an_upstream_bug_is_found_offline_too(tmp_path, base_fw, raw_fw):
    # The port has a LayerNorm eps bug and gives fc3's parameter group 3x the learning rate: every
    # gradient after the norm differs, so fc3's update was read as inheriting the eps bug and the
    # learning rate went unsaid. Each side's update over its own gradient still tells it (plain SGD).
    base, raw = BUILDERS["mlp"](base_fw), BUILDERS["mlp"](raw_fw, "eps")
    nbdiff.assign_weight(base, raw, inputs=X)
    a, b = train(base, tmp_path / "a"), train(raw, tmp_path / "b", fc3_lr=3.0)
    result = nbdiff.compare(a.parent, b.parent)
    found = {(f.step, f.phase.value, f.base_path) for f in result.findings}
    assert {(0, "forward", "norm"), (0, "optimizer", "fc3")} <= found, result.report()
    fc3 = next(f for f in result.findings if f.base_path == "fc3")
    assert "base -0.1, raw -0.3 (x3" in fc3.why(), fc3.why()
    assert not any(f.phase.value == "optimizer" and f.base_path in ("fc1", "fc2") for f in result.findings)


@pytest.mark.parametrize("dump_type", ["tensor", "statistics"])
@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_three_bug_port_recorded_in_a_notebook_is_found_whole_or_says_what_it_cannot_tell(
    tmp_path, base_fw, raw_fw, dump_type
):
    # A LayerNorm eps (forward), a user's activation with a wrong gradient (backward only) and a group
    # learning rate, recorded and compared: a tensor dump finds the three; a statistics dump finds the
    # eps, and says that the backward and updates it makes differ cannot be judged by statistics (it
    # said nothing: the other two bugs went unmentioned).
    from tests.structure_models import sgd, three_bugs

    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = three_bugs(base_fw), three_bugs(raw_fw, ("eps", "grad"))
    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    nbdiff.assign_weight(base, raw, inputs=x)
    folders = []
    for model, fw, opt, name in ((base, base_fw, sgd(base), "a"), (raw, raw_fw, sgd(raw, head_lr=0.2), "b")):
        with nbdiff.record(model, tmp_path / name, dump_type=dump_type) as rec:
            for _ in range(2):
                out = model(torch.tensor(x) if fw == "torch" else paddle.to_tensor(x))
                (out * out).mean().backward()
                opt.step()
                opt.zero_grad() if fw == "torch" else opt.clear_grad()
        folders.append(rec.path)
    result = nbdiff.compare(*folders)
    found = {(f.phase.value, f.raw_path) for f in result.findings if f.step == 0}
    said = [w for w in result.warnings if "statistics dump cannot tell" in w]
    if dump_type == "tensor":
        assert {("forward", "blocks.0.ln"), ("backward", "blocks.2.act"), ("optimizer", "head")} <= found, (
            result.report()
        )
        assert not said
    else:
        assert ("forward", "blocks.0.ln") in found, result.report()
        assert len(said) == 1 and "step 0" in said[0] and "dump_type='tensor'" in said[0], result.warnings
    assert not {p for _, p in found} & {"blocks.0.fc1", "blocks.0.fc2", "head.fc1", "emb"}, result.report()
