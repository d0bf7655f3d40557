"""A dump's files are untrusted input (trace/dump/reading): regular files only, sizes checked before
memory is taken, names printable."""

from __future__ import annotations

import json
import os
import struct
import threading

import numpy as np
import pytest

pytest.importorskip("safetensors")

from nbdiff.cli import main  # noqa: E402
from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.trace.dump.reading import printable  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from nbdiff.trace.dump.writer import write_rank  # noqa: E402
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord  # noqa: E402


def _dump(folder, path="fc", scale=1.0, model="Net"):
    x = np.arange(4, dtype="float32").reshape(2, 2)
    events = [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "", model, 0, 0, None, False, (), (TensorRecord("out", (2, 2), "float32", x * scale),)),
        Event(0, Phase.FORWARD, Kind.LAYER, 1, path, "Linear", 0, 1, 0, True, (TensorRecord("in[0]", (2, 2), "float32", x),),
              (TensorRecord("out", (2, 2), "float32", x * scale),)),
    ]  # fmt: skip
    write_rank(
        folder / "rank0", {"framework": "torch", "model": model, "rank": 0}, {path: ["Linear"]}, [events], "tensor"
    )
    return folder


def _in_a_thread(fn):
    """Run ``fn`` in a thread and wait for it to end: a read that blocks shows as a thread still alive."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the read blocked"
    return box


@pytest.mark.parametrize("name", ["step0.safetensors", "manifest.json"])
def test_a_fifo_in_place_of_a_dump_file_is_refused_without_blocking(tmp_path, name):
    folder = _dump(tmp_path / "d") / "rank0"
    target = folder / name
    target.unlink()
    os.mkfifo(target)
    box = _in_a_thread(lambda: read_dump(folder).steps[0])
    assert isinstance(box.get("error"), DumpError), box
    assert "not a regular file" in str(box["error"]) and name in str(box["error"])


def _fake_payload(file, claimed: int, header_extra: int = 0):
    """A payload whose header claims ``claimed`` bytes of one float32 tensor, the file sparse."""
    header = json.dumps({"fc.out": {"dtype": "F32", "shape": [claimed // 4], "data_offsets": [0, claimed]}}).encode()
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(header) + header_extra) + header)
        f.truncate(8 + len(header) + claimed)


def test_a_huge_sparse_payload_is_a_dump_error_before_memory_is_taken(tmp_path, capsys):
    base = _dump(tmp_path / "a")
    raw = _dump(tmp_path / "b")
    payload = raw / "rank0" / "step0.safetensors"
    _fake_payload(payload, 1 << 40)  # 1 TiB claimed, a few bytes on disk
    assert main(["compare", str(base), str(raw)]) == 2
    err = capsys.readouterr().err
    assert "DumpError" in err and "they are 1024.0 GiB, more than the" in err and "step0.safetensors" in err


def test_a_header_claiming_more_than_the_file_holds_is_a_dump_error(tmp_path):
    folder = _dump(tmp_path / "d") / "rank0"
    payload = folder / "step0.safetensors"
    data = payload.read_bytes()
    payload.write_bytes(data[:-4])  # cut short
    with pytest.raises(DumpError, match="header describes .* bytes of data, the file holds"):
        read_dump(folder).steps[0]
    _fake_payload(payload, 64, header_extra=10**9)
    with pytest.raises(DumpError, match="claims a 1000000.*-byte header"):
        read_dump(folder).steps[0]


def test_a_payload_that_is_a_link_is_not_followed(tmp_path):
    folder = _dump(tmp_path / "d") / "rank0"
    payload = folder / "step0.safetensors"
    os.rename(payload, folder / "elsewhere.bin")
    os.symlink(folder / "elsewhere.bin", payload)  # inside the folder, but swapped in for the payload
    with pytest.raises(DumpError, match="is a link"):
        read_dump(folder).steps[0]


def test_values_read_back_as_written(tmp_path):
    folder = _dump(tmp_path / "d", scale=3.0) / "rank0"
    e = read_dump(folder).steps[0][1]
    np.testing.assert_array_equal(e.outputs[0].value, np.arange(4, dtype="float32").reshape(2, 2) * 3)


def test_control_characters_in_recorded_names_never_reach_the_terminal_raw(tmp_path, capsys):
    hostile = "fc\x1b[31m\x07\nSUCCESS"
    base = _dump(tmp_path / "a", path=hostile, model="Net\x1b]0;x\x07")
    raw = _dump(tmp_path / "b", path=hostile, scale=2.0, model="Net\x1b]0;x\x07")
    assert main(["compare", str(base), str(raw), "--csv", str(tmp_path / "csv")]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert not [line for line in out.splitlines() if line.strip().startswith("SUCCESS")], out
    assert "fc\\x1b[31m\\x07\\nSUCCESS" in out
    for f in (tmp_path / "csv").rglob("*.csv"):
        text = f.read_text()
        assert "\x1b" not in text and "\x07" not in text, f


def test_printable_escapes_only_what_a_terminal_would_act_on():
    assert printable("layers.0.self_attn") == "layers.0.self_attn"
    assert printable("注意力.层") == "注意力.层"
    assert printable("a\x1bb\nc\u2028d") == "a\\x1bb\\nc\\u2028d"


@pytest.mark.parametrize("name", ["step0.safetensors", "manifest.json"])
def test_an_unreadable_dump_file_says_so_and_names_it(tmp_path, monkeypatch, capsys, name):
    # It used to say "No such file or directory". The tests run as root, who reads any file, so the
    # refusal the operating system gives another user is made here by its open call.
    folder = _dump(tmp_path / "d") / "rank0"
    real_open = os.open

    def refused(path, *args, **kwargs):
        if str(path).endswith(name):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    assert main(["compare", str(folder.parent), str(_dump(tmp_path / "e").resolve())]) == 2
    err = capsys.readouterr().err
    assert f"{folder / name}: cannot be read (Permission denied; check its permissions)" in err


@pytest.mark.parametrize(
    "text, name",
    [
        ('{"path": "fc\\u001b[31m"}', "fc\\x1b[31m"),  # an escape sequence written as JSON writes it
        ('{"path": "fc\x7f"}', "fc\\x7f"),  # DEL, which JSON allows raw in a string
        ('{"path": "fc\u2028x"}', "fc\\u2028x"),  # a line separator, raw
        ('{"path": "layers.0"}', "layers.0"),  # plain ASCII: read as it is
    ],
)
def test_every_string_read_from_json_is_printable(text, name):
    from nbdiff.trace.dump.reading import load_json

    assert load_json(text) == {"path": name}


@pytest.mark.parametrize("shape", [[2**32, 2**32], [0, 2**70]])
def test_a_shape_no_file_can_hold_is_a_dump_error_naming_the_entry(tmp_path, capsys, shape):
    # numpy's int64 product of [2**32, 2**32] wrapped to 0, which an empty span matched; np.empty then
    # raised a bare ValueError and `nbdiff compare` exited 1 ("diverged").
    base, raw = _dump(tmp_path / "a"), _dump(tmp_path / "b")
    payload = raw / "rank0" / "step0.safetensors"
    header = json.dumps({"fc.out": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    payload.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(DumpError, match="'fc.out': its offsets do not fit its shape"):
        read_dump(raw / "rank0").steps[0]
    assert main(["compare", str(base), str(raw)]) == 2
    assert "step0.safetensors" in capsys.readouterr().err
