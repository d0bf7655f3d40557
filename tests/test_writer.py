"""The dump writer: its thread, failures reported by step, statistics worked out as copies are made."""

import json
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from nbdiff.trace.dump.writer import write_rank  # noqa: E402
from nbdiff.trace.events import TensorRecord  # noqa: E402
from nbdiff.trace.stats import sample_positions  # noqa: E402
from tests.dumps import small_events  # noqa: E402


def test_a_failed_background_write_is_raised_by_close_naming_the_step(tmp_path):
    from nbdiff.trace.dump.writer import DumpWriter

    writer = DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "tensor")
    shutil.rmtree(tmp_path / "rank0")  # the folder is gone: writing step 0 fails in the writer thread
    writer.add_step(small_events())
    with pytest.raises(DumpError, match=r"rank0: writing step 0 failed"):
        writer.close()
    assert not writer._thread.is_alive()


def test_the_writer_thread_writes_while_the_next_step_is_recorded(tmp_path):
    # add_step returns before its step is written (the training code goes on), and waits only
    # when the step before is still being written: at most two steps are held, one unwritten.
    import threading

    from nbdiff.trace.dump import writer as store

    gate, entered = threading.Event(), threading.Event()
    real = store.DumpWriter._write_step

    def slow(self, k, events):
        entered.set()
        gate.wait(10)
        real(self, k, events)

    writer = store.DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "tensor")
    writer._write_step = slow.__get__(writer)
    writer.add_step(small_events())  # returns at once: step 0 is being written
    entered.wait(10)
    second = threading.Thread(target=writer.add_step, args=(small_events(),))
    second.start()  # waits for step 0 to be on disk before it hands over step 1
    second.join(0.5)
    assert second.is_alive()
    assert not (tmp_path / "rank0" / "step0.json").exists()
    gate.set()
    second.join(10)
    writer.close()
    assert len(read_dump(tmp_path / "rank0").steps) == 2


def test_statistics_started_ahead_are_computed_once_and_match_those_computed_at_write_time(tmp_path):
    # A recording hands each copy to the writer thread as it is made: the step's write then
    # uses those statistics instead of computing them again (the last step's wait was all of them).
    from nbdiff.trace import events as events_module
    from nbdiff.trace.dump import writer as store

    computed: list[int] = []
    real = store.tensor_stats

    def counting(a):
        computed.append(id(a))
        return real(a)

    meta = {"framework": "torch", "model": "M", "rank": 0}
    plain = write_rank(tmp_path / "plain", meta, {}, [small_events()], "statistics")
    ev = small_events()
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
    from nbdiff.trace.dump import writer as store

    def broken(a):
        raise MemoryError("no room")

    monkeypatch.setattr(store, "tensor_stats", broken)
    writer = store.DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "statistics")
    ev = small_events()
    writer.prepare(ev[0].outputs[0].value)
    monkeypatch.setattr(TensorRecord, "statistics", lambda self: broken(self.value))
    writer.add_step(ev)  # the writer thread lives on: no wait for it hangs
    with pytest.raises(DumpError, match=r"writing step 0 failed \(no room\)"):
        writer.close()


def test_one_writer_per_folder_and_a_killed_writers_lock_is_taken_over(tmp_path):
    # Two writers with overwrite=True on one folder left a mixed dump while one exited 0.
    import subprocess
    import sys

    from nbdiff.trace.dump.writer import DumpWriter

    meta = {"framework": "torch", "model": "M", "rank": 0}
    first = DumpWriter(tmp_path / "rank0", meta, {}, "stack", overwrite=True)
    with pytest.raises(DumpError, match=r"another recording \(process \d+\) is writing this folder"):
        DumpWriter(tmp_path / "rank0", meta, {}, "stack", overwrite=True)
    first.add_step(small_events())
    first.close()
    assert not (tmp_path / "rank0" / ".nbdiff-writing").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "rank0" / ".nbdiff-writing").write_text(dead.stdout.strip())  # a writer killed mid-way
    again = DumpWriter(tmp_path / "rank0", meta, {}, "stack", overwrite=True)
    again.add_step(small_events())
    assert again.close() == tmp_path / "rank0"


def test_a_manifest_that_cannot_be_written_names_the_file(tmp_path, monkeypatch):
    import nbdiff.trace.dump.writer as writer

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "write_json_atomic", full)
    with pytest.raises(DumpError, match=r"rank0/manifest.json: cannot be written \(No space left on device\)"):
        writer.DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "stack")
    assert not (tmp_path / "rank0" / ".nbdiff-writing").exists()  # the folder is free again


def test_a_statistics_dump_samples_activations_and_keeps_a_batchnorm_over_few_values_whole(tmp_path):
    # Samples: activations and their gradients only (a parameter's are compared in raw's layout,
    # which a sample's positions do not follow); and the values of a BatchNorm over 2 per channel.
    import numpy as np

    from nbdiff.trace.events import Event, Kind, Phase

    def tensor(name, shape):
        return TensorRecord(name, shape, "float32", np.random.RandomState(0).randn(*shape).astype("float32"))

    few, many = tensor("in[0]", (2, 3)), tensor("in[0]", (8, 3, 100))
    events = [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "bn", "BatchNorm1d", 0, 1, None, True, (few,), (tensor("out", (2, 3)),)),
        Event(0, Phase.FORWARD, Kind.LAYER, 1, "bn2", "BatchNorm1d", 0, 1, None, True, (many,), (many,)),
        Event(0, Phase.BACKWARD, Kind.LAYER, 0, "fc", "Linear", 0, 1, None, True, (many,), (many,),
              params=(tensor("grad.weight", (3, 3)),)),
        Event(0, Phase.OPTIMIZER, Kind.PARAM, 0, "fc.weight", "Linear", 0, 1, None, True, (), (tensor("out", (3, 3)),)),
    ]  # fmt: skip
    folder = write_rank(tmp_path / "rank0", dict(framework="torch", model="Net", rank=0), {}, [events], "statistics")
    bn, bn2, back, update = read_dump(folder).steps[0]
    assert bn.inputs[0].value is not None and np.array_equal(bn.inputs[0].value, few.value)
    assert bn2.inputs[0].value is None and np.array_equal(
        bn2.inputs[0].sample, many.value.ravel()[sample_positions(2400)]
    )
    assert back.outputs[0].sample is not None and back.params[0].sample is None and back.params[0].stats is not None
    assert update.outputs[0].sample is None and update.outputs[0].stats is not None


def test_a_json_file_left_half_written_is_known_as_the_dumps_own_under_either_name():
    # write_json_atomic names its temporary file uniquely now (two writers of one file at once mixed
    # theirs); an overwrite must still take a killed run's leftover as its own, and nothing else.
    from nbdiff.trace.dump.writer import _is_dump_file

    own = ["manifest.json.tmp", "manifest.json.0123456789ab.tmp", "step3.json.tmp", "step3.json.0123456789ab.tmp"]
    theirs = ["notes.json.0123456789ab.tmp", "step3.safetensors.tmp", "manifest.json.x.tmp", "mine.tmp"]
    assert [_is_dump_file(n) for n in own] == [True] * 4
    assert [_is_dump_file(n) for n in theirs] == [False] * 4


def test_a_writer_killed_while_it_replaces_a_dump_leaves_one_said_to_be_cut_off_not_edited(tmp_path):
    # kill -9 while an overwrite deleted the old files left the old manifest over a few of its steps, and
    # reading it said the dump was edited. The manifest goes first now: what is left reads as cut off.
    import subprocess
    import sys
    from pathlib import Path

    script = f"""
import os, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from nbdiff.trace.dump.writer import DumpWriter, write_rank
from tests.dumps import small_events
folder = Path({str(tmp_path / "d")!r})
write_rank(folder, {{"framework": "torch", "model": "M", "rank": 0}}, {{}}, [small_events() for _ in range(4)], "tensor")
deleted = []
real = Path.unlink
def unlink(self, *args, **kwargs):
    real(self, *args, **kwargs)
    deleted.append(self.name)
    if len(deleted) == 2:
        os._exit(9)  # killed in the middle of deleting the old dump's files
Path.unlink = unlink
DumpWriter(folder, {{"framework": "torch", "model": "M", "rank": 0}}, {{}}, "tensor", overwrite=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    import nbdiff
    from nbdiff.trace.dump.writer import DumpWriter

    for read in (lambda: nbdiff.compare(tmp_path / "d", tmp_path / "d"), lambda: read_dump(tmp_path / "d")):
        with pytest.raises(DumpError, match="cut off") as caught:
            read()
        assert "edited" not in str(caught.value)
    again = DumpWriter(tmp_path / "d", {"framework": "torch", "model": "M", "rank": 0}, {}, "tensor", overwrite=True)
    again.add_step(small_events())
    again.close()
    assert len(read_dump(tmp_path / "d").steps) == 1
