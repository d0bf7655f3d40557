"""nbdiff.record: steps, ranks, modes and scopes, dump types, data and stack filters."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from nbdiff.trace.store import read_dump  # noqa: E402
from tests.dumps import X, pair, train  # noqa: E402


def _paths(dump, step=0, phase="forward"):
    return [e.path for e in dump.steps[step] if e.phase.value == phase]


def test_every_call_of_the_model_is_a_step_with_its_updates(tmp_path):
    base, _ = pair()
    dump = read_dump(train(base, tmp_path / "d", steps=3))
    assert len(dump.steps) == 3
    assert _paths(dump)[:3] == ["", "fc1", "norm"]
    assert set(_paths(dump, 2, "optimizer")) == {"fc1", "norm", "fc2", "fc3"}
    assert dump.meta["framework"] == "torch" and dump.meta["rank"] == 0 and dump.meta["world_size"] == 1
    assert any(f.filename.endswith("dumps.py") for f in dump.steps[0][1].stack)


def test_rank_from_the_environment_picks_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    base, _ = pair()
    path = train(base, tmp_path / "d", steps=1)
    assert path.name == "rank3" and read_dump(path).meta["world_size"] == 4


@pytest.mark.parametrize(
    "mode,scope,expected",
    [
        ("list", ["NN_Linear_1", "fc3"], {"fc2", "fc3"}),
        ("range", ["norm", "NN_GELU_0"], {"norm", "fc2", "act"}),
        ("api_list", ["layernorm", "tanh"], {"norm", "mid"}),
    ],
)
def test_modes_and_scopes(tmp_path, mode, scope, expected):
    base, _ = pair()
    dump = read_dump(train(base, tmp_path / "d", steps=1, mode=mode, scope=scope))
    assert set(_paths(dump)) == expected
    assert set(_paths(dump, 0, "backward")) <= expected


def test_dump_types_and_filters(tmp_path):
    base, _ = pair()
    stats = train(base, tmp_path / "s", steps=1, dump_type="statistics")
    assert not list(stats.glob("*.safetensors"))
    stack = read_dump(train(base, tmp_path / "k", steps=1, dump_type="stack"))
    assert stack.steps[0][0].outputs[0].stats is None
    no_back = read_dump(train(base, tmp_path / "b", steps=1, retain_backward=False))
    assert not _paths(no_back, 0, "backward")
    full = read_dump(train(base, tmp_path / "f", steps=1, filter_stack=False))
    filtered = read_dump(train(base, tmp_path / "g", steps=1))
    assert len(full.steps[0][1].stack) >= len(filtered.steps[0][1].stack)
    manifest = json.loads((tmp_path / "f" / "rank0" / "manifest.json").read_text())
    assert manifest["filter_stack"] is False and manifest["dump_type"] == "tensor"


def test_bad_options_are_named(tmp_path):
    base, _ = pair()
    with pytest.raises(OptionError, match="dump_type"):
        nbdiff.record(base, tmp_path, dump_type="npy")
    with pytest.raises(OptionError, match="needs scope"):
        nbdiff.record(base, tmp_path, mode="list")
    with pytest.raises(OptionError, match="names no event"):
        train(base, tmp_path / "r", steps=1, mode="range", scope=["nope", "fc3"])


def test_steps_recorded_before_an_error_are_written(tmp_path):
    import torch

    base, _ = pair()
    with pytest.raises(RuntimeError), nbdiff.record(base, tmp_path / "d") as rec:
        base(torch.tensor(X)).mean().backward()
        raise RuntimeError("crash in step 1")
    assert len(read_dump(rec.path).steps) == 1
    assert not any(m._forward_pre_hooks for m in base.modules())


def test_parameter_gradients_of_each_step_without_zeroing(tmp_path):
    # Regression: torch adopts the gradient buffer a hook saw as `param.grad` and adds the next
    # step's gradient into it in place; step 0's recorded gradient then read twice its value.
    import torch

    base, _ = pair()
    with nbdiff.record(base, tmp_path / "d") as rec:
        for _ in range(2):
            base(torch.tensor(X)).mean().backward()  # no zero_grad: .grad accumulates
    dump = read_dump(rec.path)
    grads = [
        next(
            t
            for e in dump.steps[k]
            if e.phase.value == "backward" and e.path == "fc3"
            for t in e.params
            if t.name == "bias"
        )
        for k in (0, 1)
    ]
    assert grads[0].value.sum() == pytest.approx(1.0) and grads[1].value.sum() == pytest.approx(1.0)


def test_a_long_recording_holds_one_step_at_a_time(tmp_path):
    import torch

    base, _ = pair()
    held = []
    with nbdiff.record(base, tmp_path / "d") as rec:
        for _ in range(5):
            base(torch.tensor(X)).mean().backward()
            held.append(len(rec._session.recorder.calls))
    assert len(set(held)) == 1  # the same few calls each step, not a growing list
    dump = read_dump(rec.path)
    assert len(dump.steps) == 5 and [e.step for e in dump.steps[4]][:1] == [4]
    assert (rec.path / "step4.safetensors").is_file()
