"""The dump format: round trip, relocation, and clear errors for damaged dumps."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from nbdiff.trace.dump.writer import write_rank  # noqa: E402
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord  # noqa: E402
from nbdiff.trace.origin.stack import Frame  # noqa: E402
from tests.dumps import pair, small_events, train  # noqa: E402


def test_round_trip_keeps_values_statistics_and_stacks(tmp_path):
    write_rank(
        tmp_path / "rank0",
        {"framework": "torch", "model": "M", "rank": 0},
        {"fc": ["Linear"]},
        [small_events()],
        "tensor",
    )
    dump = read_dump(tmp_path / "rank0")
    e = dump.steps[0][0]
    np.testing.assert_array_equal(e.outputs[0].value, small_events()[0].outputs[0].value)
    assert e.outputs[0].stats.nan == 1 and e.outputs[0].stats.inf == 1 and e.outputs[0].stats.max == -0.0 + 2.0
    assert e.stack == (Frame("/u/m.py", 3, "forward"),) and e.args == ("bias=True",)
    assert dump.layers == {"fc": ["Linear"]} and dump.framework == "torch"


def test_statistics_and_stack_dumps_have_no_payload(tmp_path):
    for kind in ("statistics", "stack"):
        write_rank(tmp_path / kind, {"framework": "torch", "model": "M", "rank": 0}, {}, [small_events()], kind)
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
        from nbdiff.trace.dump.store import rank_dirs

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


def _ranks(tmp_path, names_and_ranks):
    from nbdiff.trace.dump.store import rank_dirs

    root = tmp_path / "dump"
    for name, rank in names_and_ranks:
        write_rank(root / name, {"framework": "torch", "model": "M", "rank": rank}, {}, [small_events()], "stack")
    return root, rank_dirs


@pytest.mark.parametrize(
    "folders, says",
    [
        ([("rank0", 0), ("rank00", 0)], "rank00: holds the dump of rank 0, so it must be named rank0"),
        ([("rank2", 2), ("rankfoo", 1)], "rankfoo: holds the dump of rank 1, so it must be named rank1"),
    ],
)
def test_a_rank_folder_is_named_by_its_rank_or_refused(tmp_path, folders, says):
    # rank0 and rank00 were read as one rank, and rankfoo silently replaced rank2.
    root, rank_dirs = _ranks(tmp_path, folders)
    with pytest.raises(DumpError, match=says):
        rank_dirs(root)


def test_a_linked_rank_folder_says_why_it_is_not_read(tmp_path):
    root, rank_dirs = _ranks(tmp_path, [("rank0", 0)])
    elsewhere = tmp_path / "elsewhere"
    write_rank(elsewhere, {"framework": "torch", "model": "M", "rank": 1}, {}, [small_events()], "stack")
    (root / "rank1").symlink_to(elsewhere)
    with pytest.raises(DumpError, match="rank1: a link; nbdiff does not follow links inside a dump"):
        rank_dirs(root)
    (root / "rank1").unlink()
    assert sorted(rank_dirs(root)) == [0]
