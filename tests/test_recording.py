"""nbdiff.record: steps, ranks, modes and scopes, dump types, data and stack filters."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
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


def test_recording_into_a_folder_that_holds_a_dump_needs_consent(tmp_path):
    # The old manifest beside new payloads: compare silently mixed two runs.
    from nbdiff.errors import DumpError

    base, _ = pair()
    train(base, tmp_path / "d", steps=3)
    with pytest.raises(DumpError, match="already holds an nbdiff dump.*overwrite=True"):
        train(base, tmp_path / "d", steps=1)
    assert len(read_dump(tmp_path / "d" / "rank0").steps) == 3  # nothing lost
    path = train(base, tmp_path / "d", steps=1, overwrite=True)
    assert len(read_dump(path).steps) == 1 and sorted(p.name for p in path.iterdir()) == [
        "manifest.json", "step0.json", "step0.safetensors",
    ]  # fmt: skip


def test_a_step_the_code_raised_in_is_marked_and_never_agreement(tmp_path):
    import paddle

    from nbdiff.errors import DumpError
    from nbdiff.offline import compare

    base, raw = pair()
    full = train(base, tmp_path / "full", steps=1)
    with pytest.raises(RuntimeError):
        with nbdiff.record(raw, tmp_path / "cut"):
            raw(paddle.to_tensor(X))  # forward only: the step is cut short
            raise RuntimeError("out of memory")
    cut = read_dump(tmp_path / "cut" / "rank0")
    assert cut.incomplete == {0} and cut.closed
    with pytest.raises(DumpError, match="cut short by an exception"):
        compare(full.parent, tmp_path / "cut")  # was SUCCESS with exit 0


def test_an_unwritable_folder_is_a_dump_error(tmp_path):
    from nbdiff.errors import DumpError

    blocker = tmp_path / "file"
    blocker.write_text("")
    base, _ = pair()
    with pytest.raises(DumpError, match="cannot write a dump here"):
        train(base, blocker / "d", steps=1)
    assert not any(m._forward_pre_hooks for m in base.modules())


KILLED = """
import os, signal, sys, torch
sys.path.insert(0, {repo!r})
import nbdiff
from tests.dumps import X, pair
torch.manual_seed(0)
base, _ = pair()
opt = torch.optim.SGD(base.parameters(), lr=0.1)
with nbdiff.record(base, {path!r}):
    for step in range(4):
        base(torch.tensor(X)).mean().backward(); opt.step(); opt.zero_grad()
        if step == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-recording: no close, no finally
"""


def test_kill_9_keeps_every_completed_step(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import torch

    from nbdiff.offline import compare

    repo = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", KILLED.format(repo=repo, path=str(tmp_path / "killed"))])
    assert proc.returncode == -9
    dump = read_dump(tmp_path / "killed" / "rank0")
    # Step 2 was running; step 1 may still have been in the writer thread. Whatever was written is whole.
    assert len(dump.steps) in (1, 2) and not dump.closed and not dump.incomplete
    assert all(len(events) > 0 for events in dump.steps)
    torch.manual_seed(0)
    base, _ = pair()
    train(base, tmp_path / "full", steps=len(dump.steps))
    result = compare(tmp_path / "full", tmp_path / "killed")
    assert result and any("did not end cleanly" in w for w in result.warnings)


def test_a_scope_that_matches_nothing_is_never_success(tmp_path):
    from nbdiff.errors import DumpError
    from nbdiff.offline import compare

    base, raw = pair()
    train(base, tmp_path / "a", steps=1, mode="list", scope=["no_such_layer"])
    train(raw, tmp_path / "b", steps=1, mode="list", scope=["no_such_layer"])
    with pytest.raises(DumpError, match="no event was compared.*mode/scope"):
        compare(tmp_path / "a", tmp_path / "b")


def test_a_long_recording_holds_no_step_in_memory(tmp_path):
    # The writer kept every step's JSON to rewrite the manifest: memory and disk writes grew with steps.
    base, _ = pair()
    path = train(base, tmp_path / "d", steps=5)
    assert sorted(p.name for p in path.glob("step*.json")) == [f"step{k}.json" for k in range(5)]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["steps"] == 5 and manifest["complete"] is True and len(json.dumps(manifest)) < 4000


def test_a_recording_computes_statistics_as_it_copies_not_when_the_step_is_written(tmp_path, monkeypatch):
    # Only the optimizer's updates and the weights the first step began with (worked out when a step is
    # handed over) are left to the write, where a writer thread works beside the training (a core is
    # left for it).
    from nbdiff.frameworks.torch import TorchFramework
    from nbdiff.trace import events as events_module
    from nbdiff.trace.dump import writer as store

    monkeypatch.setattr(TorchFramework, "cores_taken", lambda self, t: False)
    writing, at_write, written = [False], [], []
    real_stats, real_write = store.tensor_stats, store.DumpWriter._write_step

    def counting(a):
        if writing[0]:
            at_write.append(id(a))
        return real_stats(a)

    def write_step(self, k, events):
        writing[0] = True
        try:
            real_write(self, k, events)
        finally:
            writing[0] = False
        written.append(
            {
                id(t.value)
                for e in events
                if e.phase.value in ("optimizer", "weights")
                for t in e.inputs + e.outputs + e.params
            }
        )

    monkeypatch.setattr(store, "tensor_stats", counting)
    monkeypatch.setattr(events_module, "tensor_stats", counting)
    monkeypatch.setattr(store.DumpWriter, "_write_step", write_step)
    base, _ = pair()
    read_dump(train(base, tmp_path / "d", steps=2, dump_type="statistics"))
    assert len(written) == 2 and at_write
    assert set(at_write) <= set().union(*written)


def test_gradients_of_a_layer_used_without_being_called_are_in_its_callers_backward_event(tmp_path):
    # torch's MultiheadAttention reads out_proj.weight directly: out_proj has no event of its own.
    import numpy as np
    import torch

    from tests.fault_suite.models import BUILDERS, inputs

    model = BUILDERS["transformer"]("torch")
    with nbdiff.record(model, tmp_path / "d") as rec:
        model(torch.tensor(np.asarray(inputs("transformer")))).mean().backward()
    events = read_dump(rec.path).steps[0]
    attn = next(e for e in events if e.phase.value == "backward" and e.path == "attn")
    grads = {t.name: t.value for t in attn.params}
    assert {"in_proj_weight", "out_proj.weight", "out_proj.bias"} <= set(grads)
    np.testing.assert_array_equal(grads["out_proj.weight"], model.attn.out_proj.weight.grad.numpy())
    assert not any(e.path == "attn.out_proj" for e in events if e.phase.value == "backward")


def test_a_ctrl_c_during_the_last_flush_still_closes_the_dump(tmp_path, monkeypatch):
    # The writer thread stayed alive and the dump was never marked complete.
    import os
    import signal

    import torch

    from nbdiff.trace.dump.writer import DumpWriter

    add_step = DumpWriter.add_step
    sent = []

    def interrupted(self, events):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return add_step(self, events)

    monkeypatch.setattr(DumpWriter, "add_step", interrupted)
    base, _ = pair()
    with pytest.raises(KeyboardInterrupt):
        with nbdiff.record(base, tmp_path / "d") as rec:
            base(torch.from_numpy(X)).mean().backward()
    manifest = json.loads((rec.path / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["steps"] == 1
    read_dump(rec.path)  # a closed dump reads


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_another_threads_calls_are_not_merged_into_the_steps(tmp_path, fw):
    # 3 steps of the recording thread and 5 calls from another gave 8 (or, interleaved, 20 to 22 of 23).
    import threading

    import paddle
    import torch

    model, _ = pair(base_fw=fw)
    x = (lambda: torch.tensor(X)) if fw == "torch" else (lambda: paddle.to_tensor(X))
    with pytest.warns(UserWarning, match=r"5 call\(s\) of the model from threads other than the one recording"):
        with nbdiff.record(model, tmp_path / "d") as rec:
            model(x()).mean().backward()
            other = threading.Thread(target=lambda: [model(x()) for _ in range(5)])
            other.start()
            other.join()
            for _ in range(2):
                model(x()).mean().backward()
    dump = read_dump(rec.path)
    assert len(dump.steps) == 3 and dump.meta["calls_from_other_threads"] == 5
    assert all(len([e for e in s if e.path == "fc1" and e.phase.value == "forward"]) == 1 for s in dump.steps)


def test_recording_says_it_turned_dropout_off(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.3))
    with pytest.warns(UserWarning, match=r"dropout was off while recording \(1\.p=0\.3\)"):
        with nbdiff.record(model, tmp_path / "d"):
            model(torch.ones(2, 4))
    assert model[1].p == 0.3
    assert json.loads((tmp_path / "d" / "rank0" / "manifest.json").read_text())["dropout_off"] == ["1.p=0.3"]


@pytest.mark.parametrize("taken", [True, False])
def test_the_dump_is_written_in_the_training_thread_where_the_frameworks_threads_take_every_core(
    tmp_path, monkeypatch, taken
):
    """A writer thread beside torch's threads, which take every core, only competed for one: the torch
    CNN's statistics dump took 2.76-2.81x its bare step with it, 2.31-2.38x written in the training
    thread. Where a core is left, the writer thread works while the next step runs."""
    import threading

    import torch

    from nbdiff.frameworks import torch as adapter

    def writers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "nbdiff-dump-writer"}

    monkeypatch.setattr(adapter.TorchFramework, "cores_taken", lambda self, t: taken)
    model = torch.nn.Linear(4, 4)
    others = writers()  # another test's recording, should one still be closing
    with nbdiff.record(model, tmp_path, dump_type="statistics"):
        for _ in range(2):
            model(torch.ones(2, 4)).sum().backward()
        started = writers() - others
    assert bool(started) is not taken
    dump = read_dump(tmp_path / "rank0")
    assert len(dump.steps) == 2 and all(e.outputs[0].stats is not None for e in dump.steps[1] if e.outputs)


def test_a_ctrl_c_just_as_the_writer_starts_leaves_no_thread_and_no_lock(tmp_path, monkeypatch):
    # A real SIGINT landing once the writer's thread ran and its folder lock was taken, before record
    # held the writer: the thread ran on, and the next record(..., overwrite=True) there was refused.
    import signal
    import threading

    import torch

    from nbdiff.trace.dump import writer as writer_module

    made = writer_module.DumpWriter.__init__

    def interrupted(self, *args, **kwargs):
        made(self, *args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, at the worst moment

    model = pair()[0]
    monkeypatch.setattr(writer_module.DumpWriter, "__init__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with nbdiff.record(model, tmp_path / "d"):
            pass
    monkeypatch.setattr(writer_module.DumpWriter, "__init__", made)
    assert not [t for t in threading.enumerate() if t.name == "nbdiff-dump-writer" and t.is_alive()]
    with nbdiff.record(model, tmp_path / "d", overwrite=True) as rec:
        model(torch.tensor(X))
    assert rec.path is not None


def test_a_mesh_given_as_sizes_is_recorded_with_the_ranks_place_on_it(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    model = torch.nn.Linear(2, 2)
    with nbdiff.record(model, tmp_path / "d", mesh={"dp": 2, "tp": 2}):
        model(torch.ones(1, 2)).sum().backward()
    mesh = json.loads((tmp_path / "d" / "rank3" / "manifest.json").read_text())["mesh"]
    assert mesh == {
        "shape": [2, 2],
        "names": ["dp", "tp"],
        "coordinate": [1, 1],
        "data_parallel": ["dp"],
        "reduce": "mean",
    }
    with pytest.raises(OptionError, match=r"record\(mesh=\{'dp': 2\}\): its 2 places do not match the job's 4 ranks"):
        nbdiff.record(model, tmp_path / "e", mesh={"dp": 2}).__enter__()
    with pytest.raises(OptionError, match=r"data_parallel='batch'\) needs the mesh"):
        nbdiff.record(model, tmp_path / "f", data_parallel="batch").__enter__()
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()  # refused before anything was written
