"""The dump format: round trip, relocation, and clear errors for damaged dumps."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord  # noqa: E402
from nbdiff.trace.stack import Frame  # noqa: E402
from nbdiff.trace.store import read_dump, write_rank  # noqa: E402
from tests.dumps import pair, train  # noqa: E402


def _events():
    x = np.array([[1.0, np.nan], [np.inf, -2.0]], "float32")
    return [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "fc", "Linear", 0, 1, None, True, (TensorRecord("in[0]", (2, 2), "float32", x),),
              (TensorRecord("out", (2, 2), "float32", x * 2),), args=("bias=True",), stack=(Frame("/u/m.py", 3, "forward"),)),
    ]  # fmt: skip


def test_round_trip_keeps_values_statistics_and_stacks(tmp_path):
    write_rank(
        tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {"fc": ["Linear"]}, [_events()], "tensor"
    )
    dump = read_dump(tmp_path / "rank0")
    e = dump.steps[0][0]
    np.testing.assert_array_equal(e.outputs[0].value, _events()[0].outputs[0].value)
    assert e.outputs[0].stats.nan == 1 and e.outputs[0].stats.inf == 1 and e.outputs[0].stats.max == -0.0 + 2.0
    assert e.stack == (Frame("/u/m.py", 3, "forward"),) and e.args == ("bias=True",)
    assert dump.layers == {"fc": ["Linear"]} and dump.framework == "torch"


def test_statistics_and_stack_dumps_have_no_payload(tmp_path):
    for kind in ("statistics", "stack"):
        write_rank(tmp_path / kind, {"framework": "torch", "model": "M", "rank": 0}, {}, [_events()], kind)
        assert not list((tmp_path / kind).glob("*.safetensors"))
        t = read_dump(tmp_path / kind).steps[0][0].outputs[0]
        assert t.value is None and (t.stats is None) == (kind == "stack")


def test_a_dump_can_be_moved(tmp_path):
    base, _ = pair()
    path = train(base, tmp_path / "a", steps=2)
    moved = shutil.move(str(tmp_path / "a"), str(tmp_path / "elsewhere"))
    dump = read_dump(f"{moved}/rank0")
    assert len(dump.steps) == 2 and dump.steps[1][0].outputs[0].value is not None
    assert path.name == "rank0"


def test_damaged_dumps_name_the_file(tmp_path):
    base, _ = pair()
    folder = train(base, tmp_path / "a", steps=1)
    manifest = folder / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(DumpError, match="manifest.json: not valid JSON"):
        read_dump(folder)
    data = json.loads(text)
    data["version"] = 99
    manifest.write_text(json.dumps(data))
    with pytest.raises(DumpError, match="format version 99"):
        read_dump(folder)
    manifest.write_text(text)
    (folder / "step0.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(DumpError, match="step0.safetensors: cannot read step 0"):
        read_dump(folder)
    with pytest.raises(DumpError, match="no nbdiff dump here"):
        from nbdiff.trace.store import rank_dirs

        rank_dirs(tmp_path / "missing")


def test_no_pickle_anywhere_in_a_dump(tmp_path):
    base, _ = pair()
    folder = train(base, tmp_path / "a", steps=1)
    for f in folder.iterdir():
        assert not f.read_bytes().startswith(b"\x80"), f"{f} looks like a pickle"
    assert {f.suffix for f in folder.iterdir()} == {".json", ".safetensors"}


def test_a_scalar_tensor_keeps_its_shape(tmp_path):
    # np.ascontiguousarray made 0-d values 1-d: reading the dump back failed on every scalar loss.
    loss = np.array(2.5, "float32")
    events = [Event(0, Phase.FORWARD, Kind.LOSS, 0, "<loss>", "Loss", 0, 0, None, False, (),
                    (TensorRecord("loss", (), "float32", loss),))]  # fmt: skip
    path = write_rank(tmp_path / "rank0", dict(framework="torch", model="M", rank=0), {}, [events], "tensor")
    (t,) = read_dump(path).steps[0][0].outputs
    assert t.shape == () and t.value.shape == () and float(t.value) == 2.5


def test_a_failed_background_write_is_raised_by_close_naming_the_step(tmp_path):
    from nbdiff.trace.store import DumpWriter

    writer = DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "tensor")
    shutil.rmtree(tmp_path / "rank0")  # the folder is gone: writing step 0 fails in the writer thread
    writer.add_step(_events())
    with pytest.raises(DumpError, match=r"rank0: writing step 0 failed"):
        writer.close()
    assert not writer._thread.is_alive()


def test_the_writer_thread_writes_while_the_next_step_is_recorded(tmp_path):
    # add_step returns before its step is written (the training code goes on), and waits only
    # when the step before is still being written: at most two steps are held, one unwritten.
    import threading

    from nbdiff.trace import store

    gate, entered = threading.Event(), threading.Event()
    real = store.DumpWriter._write_step

    def slow(self, k, events):
        entered.set()
        gate.wait(10)
        real(self, k, events)

    writer = store.DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "tensor")
    writer._write_step = slow.__get__(writer)
    writer.add_step(_events())  # returns at once: step 0 is being written
    entered.wait(10)
    second = threading.Thread(target=writer.add_step, args=(_events(),))
    second.start()  # waits for step 0 to be on disk before it hands over step 1
    second.join(0.5)
    assert second.is_alive()
    assert not (tmp_path / "rank0" / "step0.json").exists()
    gate.set()
    second.join(10)
    writer.close()
    assert len(read_dump(tmp_path / "rank0").steps) == 2


def test_values_shared_by_two_tensors_are_stored_once_and_read_back_for_both(tmp_path):
    shared = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = TensorRecord("out", (2, 3), "float32", shared)
    b = TensorRecord("in[0]", (2, 3), "float32", shared)
    events = [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "a", "Linear", 0, 1, None, True, (), (a,)),
        Event(0, Phase.FORWARD, Kind.LAYER, 1, "b", "Tanh", 0, 1, None, True, (b,), (a,)),
    ]
    path = write_rank(
        tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0, "world_size": 1}, {}, [events], "tensor"
    )
    from safetensors.numpy import load_file

    assert len(load_file(str(path / "step0.safetensors"))) == 1
    back = read_dump(path).steps[0]
    for e in back:
        for t in e.inputs + e.outputs:
            np.testing.assert_array_equal(t.value, shared)


def test_statistics_started_ahead_are_computed_once_and_match_those_computed_at_write_time(tmp_path):
    # A recording hands each copy to the writer thread as it is made: the step's write then
    # uses those statistics instead of computing them again (the last step's wait was all of them).
    from nbdiff.trace import events as events_module
    from nbdiff.trace import store

    computed: list[int] = []
    real = store.tensor_stats

    def counting(a):
        computed.append(id(a))
        return real(a)

    meta = {"framework": "torch", "model": "M", "rank": 0}
    plain = write_rank(tmp_path / "plain", meta, {}, [_events()], "statistics")
    ev = _events()
    arrays = [t.value for e in ev for t in e.inputs + e.outputs]
    store.tensor_stats = events_module.tensor_stats = counting
    try:
        writer = store.DumpWriter(tmp_path / "ahead", meta, {}, "statistics")
        for a in arrays:
            writer.prepare(a)
        writer.add_step(ev)
        writer.close()
    finally:
        store.tensor_stats = events_module.tensor_stats = real
    assert sorted(computed) == sorted(id(a) for a in arrays)  # each once, none again at write time
    assert writer._ahead == {}  # nothing held once the step is written
    step = lambda p: json.loads((p / "step0.json").read_text())["events"]  # noqa: E731
    assert step(tmp_path / "ahead") == step(plain)


def test_statistics_that_fail_ahead_are_computed_again_by_the_write_which_reports_them(tmp_path, monkeypatch):
    from nbdiff.trace import store

    def broken(a):
        raise MemoryError("no room")

    monkeypatch.setattr(store, "tensor_stats", broken)
    writer = store.DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "statistics")
    ev = _events()
    writer.prepare(ev[0].outputs[0].value)
    monkeypatch.setattr(TensorRecord, "statistics", lambda self: broken(self.value))
    writer.add_step(ev)  # the writer thread lives on: no wait for it hangs
    with pytest.raises(DumpError, match=r"writing step 0 failed \(no room\)"):
        writer.close()
