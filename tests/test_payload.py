"""A step's safetensors payload written array by array: what safetensors reads back, and every fallback."""

import json
import struct
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from nbdiff.trace.dump import payload as payload_module
from nbdiff.trace.dump.payload import PayloadFile, header_room


def _arrays():
    rng = np.random.RandomState(0)
    return {
        "fwd.0.out.out": rng.randn(4, 5).astype(np.float32),
        "fwd.1.in.in[0]": np.asfortranarray(rng.randn(3, 6)),  # written in C order
        "bwd.2.out.out": np.array(2.5, np.float32),  # 0-d keeps its shape
        "fwd.3.out.mask": rng.rand(7) > 0.5,
        "fwd.4.out.empty": np.zeros((0, 3), np.float16),
    }


def _header(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return n, data[8 : 8 + n]


def _assert_reads_back(path, named):
    back = load_file(str(path))
    for key, a in named.items():
        assert back[key].shape == a.shape and back[key].dtype == a.dtype
        np.testing.assert_array_equal(back[key], a)


def test_arrays_written_as_they_come_read_back_under_the_names_given_at_the_end(tmp_path):
    named = _arrays()
    f = PayloadFile(tmp_path / "step0.safetensors", 4096)
    for a in named.values():
        f.add(a)
    f.add(named["fwd.0.out.out"])  # the same array again: stored once
    f.finish(named)
    _assert_reads_back(tmp_path / "step0.safetensors", named)
    n, header = _header(tmp_path / "step0.safetensors")
    assert n == 4096 - 8 and header.endswith(b" ")  # the room, padded with spaces as the format allows
    assert f.header_size == len(header.rstrip(b" ")) and set(json.loads(header)) == set(named)


def test_arrays_the_step_did_not_keep_fill_their_bytes_as_unused_entries(tmp_path):
    # safetensors refuses a gap between tensors
    named = _arrays()
    dropped = np.arange(4, dtype=np.int64)
    f = PayloadFile(tmp_path / "s.safetensors", 4096)
    f.add(named["fwd.0.out.out"])
    f.add(dropped)
    f.finish(named)  # the rest are written now
    back = load_file(str(tmp_path / "s.safetensors"))
    assert back["unused.0"].nbytes == dropped.nbytes
    _assert_reads_back(tmp_path / "s.safetensors", named)


def test_a_header_larger_than_its_room_writes_the_file_whole(tmp_path):
    named = {f"t{i}": np.full(3, i, np.float32) for i in range(200)}
    f = PayloadFile(tmp_path / "s.safetensors", 4096)
    for a in named.values():
        f.add(a)
    f.finish(named)
    _assert_reads_back(tmp_path / "s.safetensors", named)
    assert f.header_size > 4096  # the next step's room is sized from it
    assert header_room(f.header_size) > f.header_size


def test_a_type_safetensors_cannot_name_is_left_to_safetensors_itself(tmp_path):
    named = {"big_endian": np.arange(3, dtype=">f4"), "x": np.ones(2, np.float32)}
    f = PayloadFile(tmp_path / "s.safetensors", 4096)
    for a in named.values():
        f.add(a)
    f.finish(named)
    np.testing.assert_array_equal(load_file(str(tmp_path / "s.safetensors"))["big_endian"], [0, 1, 2])


def test_a_write_that_fails_on_the_way_falls_back_to_writing_the_file_whole(tmp_path, monkeypatch):
    named = _arrays()
    f = PayloadFile(tmp_path / "s.safetensors", 4096)

    def full(*args):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(payload_module, "pwrite_all", full)
        f.add(named["fwd.0.out.out"])
    f.finish(named)
    _assert_reads_back(tmp_path / "s.safetensors", named)


def test_a_discarded_payload_leaves_no_file(tmp_path):
    f = PayloadFile(tmp_path / "s.safetensors", 4096)
    f.add(np.ones(4, np.float32))
    f.discard()
    assert not (tmp_path / "s.safetensors").exists()


def test_a_dump_writer_writes_the_bytes_before_the_step_is_handed_over(tmp_path):
    pytest.importorskip("torch")
    from nbdiff.trace.dump.store import read_dump
    from nbdiff.trace.dump.writer import DumpWriter, write_rank
    from nbdiff.trace.events import Event, Kind, Phase, TensorRecord

    x = np.random.RandomState(1).randn(64, 32).astype(np.float32)
    y = np.tanh(x)
    events = [Event(0, Phase.FORWARD, Kind.LAYER, 0, "act", "Tanh", 0, 1, None, True,
                    (TensorRecord("in[0]", x.shape, "float32", x),), (TensorRecord("out", y.shape, "float32", y),))]  # fmt: skip
    meta = {"framework": "torch", "model": "M", "rank": 0}
    writer = DumpWriter(tmp_path / "ahead", meta, {}, "tensor")
    writer.prepare(x)
    writer.prepare(y)
    file = tmp_path / "ahead" / "step0.safetensors"
    deadline = time.monotonic() + 120  # a cap, not a wait: the loop ends once the file is there
    while not (file.exists() and file.stat().st_size >= x.nbytes + y.nbytes) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert file.exists() and file.stat().st_size >= x.nbytes + y.nbytes  # while the step still runs
    writer.add_step(events)
    writer.close()
    plain = write_rank(tmp_path / "plain", meta, {}, [events], "tensor")
    got, want = read_dump(tmp_path / "ahead").steps[0][0], read_dump(plain).steps[0][0]
    for a, b in zip(got.inputs + got.outputs, want.inputs + want.outputs):
        np.testing.assert_array_equal(a.value, b.value)
        assert a.stats == b.stats


def test_a_payload_mostly_of_arrays_the_step_did_not_keep_is_written_again_compactly(tmp_path):
    named = {"kept": np.ones(100, np.float32)}
    f = PayloadFile(tmp_path / "s.safetensors", 4096)
    f.add(np.zeros(1000, np.float32))  # replaced later (a partial gradient sum)
    f.add(named["kept"])
    f.finish(named)
    assert set(load_file(str(tmp_path / "s.safetensors"))) == {"kept"}
    assert (tmp_path / "s.safetensors").stat().st_size < 4096


def test_a_step_that_keeps_no_values_leaves_no_payload_file(tmp_path):
    # Its copies were written as they came (an integer tensor, then filtered out of the step).
    from nbdiff.trace.dump.store import read_dump
    from nbdiff.trace.dump.writer import DumpWriter
    from nbdiff.trace.events import Event, Kind, Phase

    writer = DumpWriter(tmp_path / "rank0", {"framework": "torch", "model": "M", "rank": 0}, {}, "tensor")
    writer.prepare(np.arange(1000, dtype=np.int64))
    file = tmp_path / "rank0" / "step0.safetensors"
    deadline = time.monotonic() + 120  # a cap, not a wait: the loop ends once the file is there
    while not file.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.add_step([Event(0, Phase.FORWARD, Kind.LAYER, 0, "a", "Embedding", 0, 1, None, True, (), ())])
    writer.close()
    assert not file.exists()
    assert json.loads((tmp_path / "rank0" / "step0.json").read_text())["payload"] is None
    assert len(read_dump(tmp_path / "rank0").steps) == 1
