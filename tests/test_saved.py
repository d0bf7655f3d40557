"""DiffResult.save / nbdiff.load: JSON plus safetensors, no pickle, the same verdict, blame and events."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.cli import main  # noqa: E402
from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.view.model import build_tree, node_detail  # noqa: E402
from tests.test_explain import X, _net  # noqa: E402


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_round_trip_keeps_verdict_blame_and_events(tmp_path, base_fw, raw_fw):
    result = nbdiff.auto_diff(_net(base_fw), _net(raw_fw, eps=1e-3), X)
    path = result.save(str(tmp_path / "r"))
    loaded = nbdiff.load(path)
    assert bool(loaded) == bool(result) and loaded.first_divergence.describe() == result.first_divergence.describe()
    assert loaded.first_divergence.why() == result.first_divergence.why() == "eps: base 1e-05, raw 0.001"
    assert loaded.first_divergence.local_error == result.first_divergence.local_error
    assert [(d.base.key, d.raw.key, d.tensors, d.local) for d in loaded.events] == [
        (d.base.key, d.raw.key, d.tensors, d.local) for d in result.events
    ]
    a, b = result.events[3].base.outputs[0], loaded.events[3].base.outputs[0]
    assert np.array_equal(a.value, b.value) and a.statistics() == b.statistics()
    assert loaded.report().splitlines()[:6] == result.report().splitlines()[:6]
    # The view works on it: same rows, and a row's tensors with their statistics.
    tree = build_tree(loaded)
    assert tree.nodes == build_tree(result).nodes and node_detail(tree, tree.first)["tensors"][0]["base"]["shape"]
    assert {p.suffix for p in tmp_path.joinpath("r").iterdir()} == {".json", ".safetensors"}


def test_nbdiff_view_writes_the_page(tmp_path, capsys):
    result = nbdiff.auto_diff(_net("torch"), _net("paddle", approximate=True), X)
    result.save(str(tmp_path / "r"))
    # Viewing a diverged result succeeds: 0 (it was 1, compare's "diverged", and stopped scripts).
    assert main(["view", str(tmp_path / "r"), "--no-browser"]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert "nbd-data" in page and "act" in page and "HTML report:" in capsys.readouterr().out


def test_a_damaged_saved_result_is_a_dump_error(tmp_path):
    result = nbdiff.auto_diff(_net("torch"), _net("paddle"), X)
    path = tmp_path / "r"
    result.save(str(path))
    data = json.loads((path / "result.json").read_text())
    data["events"][0]["tensors"][0]["ratio"] = {"x": 1}
    (path / "result.json").write_text(json.dumps(data))
    with pytest.raises(DumpError, match="result.json: malformed saved result"):
        nbdiff.load(str(path))
    with pytest.raises(DumpError, match="missing"):
        nbdiff.load(str(tmp_path / "nothing"))


def test_a_compare_result_keeps_the_worst_errors_of_every_step(tmp_path):
    from tests.dumps import pair, train

    base, raw = pair()
    a = train(base, tmp_path / "a", steps=5)
    b = train(raw, tmp_path / "b", steps=5, late_bug_at=3)
    result = nbdiff.compare(a, b, keep_steps=1)
    loaded = nbdiff.load(result.save(str(tmp_path / "r")))
    assert [r["step"] for r in loaded.step_errors()] == [0, 1, 2, 3, 4]
    assert loaded.step_errors() == result.step_errors() and loaded.notes == result.notes


def test_a_save_over_another_cut_short_loads_as_the_old_result_never_a_mix(tmp_path, monkeypatch):
    # The tensors were written over the old ones, then the kill came before the JSON: old JSON plus
    # new tensors loaded without error.
    import nbdiff.report.saved as saved

    old = nbdiff.auto_diff(_net("torch"), _net("paddle", eps=1e-3), X)
    new = nbdiff.auto_diff(_net("torch"), _net("paddle", approximate=True), X)
    path = old.save(str(tmp_path / "r"))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(saved, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        new.save(path)
    monkeypatch.undo()
    loaded = nbdiff.load(path)
    assert loaded.first_divergence.describe() == old.first_divergence.describe()
    a, b = old.events[3].base.outputs[0], loaded.events[3].base.outputs[0]
    assert np.array_equal(a.value, b.value)
    new.save(path)
    assert nbdiff.load(path).first_divergence.describe() == new.first_divergence.describe()
    assert len(list((tmp_path / "r").glob("*.safetensors"))) == 1  # the replaced result's tensors are gone


def test_saved_tensors_named_outside_the_folder_are_refused(tmp_path):
    path = nbdiff.auto_diff(_net("torch"), _net("paddle"), X).save(str(tmp_path / "r"))
    data = json.loads((tmp_path / "r" / "result.json").read_text())
    data["tensors"] = "../elsewhere.safetensors"
    (tmp_path / "r" / "result.json").write_text(json.dumps(data))
    with pytest.raises(DumpError, match="expected a file name in the result's folder"):
        nbdiff.load(path)


def test_a_save_that_cannot_be_written_names_the_folder(tmp_path, monkeypatch):
    import safetensors.numpy

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    with pytest.raises(DumpError, match=r"r: cannot save the result there \(No space left on device\)"):
        nbdiff.auto_diff(_net("torch"), _net("paddle"), X).save(str(tmp_path / "r"))


def test_a_saved_result_claiming_a_huge_depth_is_refused(tmp_path):
    # The view indented by it: 5.9 GB, then a crash.
    path = nbdiff.auto_diff(_net("torch"), _net("paddle"), X).save(str(tmp_path / "r"))
    data = json.loads((tmp_path / "r" / "result.json").read_text())
    data["events"][1]["base"]["depth"] = 10**9
    (tmp_path / "r" / "result.json").write_text(json.dumps(data))
    with pytest.raises(DumpError, match=r"depth is 1000000000; no model nests calls deeper than 10000"):
        nbdiff.load(path)


def test_nbdiff_view_does_not_write_through_a_link_in_the_result_folder(tmp_path, capsys):
    path = nbdiff.auto_diff(_net("torch"), _net("paddle"), X).save(str(tmp_path / "r"))
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (tmp_path / "r" / "report.html").symlink_to(target)
    assert main(["view", path, "--no-browser"]) == 2
    assert "report.html: a link; the page is not written through it" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_a_save_deletes_only_the_tensors_of_the_result_it_replaces(tmp_path):
    # It deleted every tensors*.safetensors of the folder: the user's own files too.
    folder = tmp_path / "r"
    folder.mkdir()
    mine = {
        name: folder / name
        for name in ("tensors.safetensors", "tensors_finetuned.safetensors", "tensors-x.safetensors")
    }
    for path in mine.values():
        path.write_bytes(b"the user's")
    first = nbdiff.auto_diff(_net("torch"), _net("paddle", eps=1e-3), X)
    first.save(str(folder))
    own = json.loads((folder / "result.json").read_text())["tensors"]
    nbdiff.auto_diff(_net("torch"), _net("paddle", approximate=True), X).save(str(folder))
    assert all(path.read_bytes() == b"the user's" for path in mine.values())
    assert not (folder / own).exists()  # the replaced result's own tensors are gone
    assert nbdiff.load(str(folder)).first_divergence is not None


@pytest.mark.parametrize("damage", ["fifo", "sparse"])
def test_a_saved_results_tensors_file_is_read_with_the_checks_a_dump_gets(tmp_path, capsys, damage):
    # A FIFO in place of the tensors file hung `nbdiff view`; a sparse file claiming 4 GiB was read whole
    # (a bare MemoryError where memory was short, exit 1).
    import os
    import struct
    import threading

    path = tmp_path / "r"
    nbdiff.auto_diff(_net("torch"), _net("paddle"), X).save(str(path))
    tensors = path / json.loads((path / "result.json").read_text())["tensors"]
    tensors.unlink()
    if damage == "fifo":
        os.mkfifo(tensors)
    else:
        header = json.dumps({"0.b.out": {"dtype": "F32", "shape": [2**30], "data_offsets": [0, 2**32]}}).encode()
        with open(tensors, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            f.truncate(8 + len(header) + 2**32 - 4)  # 4 bytes short of what it claims, sparse
    box = {}
    t = threading.Thread(target=lambda: box.update(code=main(["view", str(path), "--no-browser"])), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the read blocked"
    assert box["code"] == 2
    err = capsys.readouterr().err
    said = "is not a regular file" if damage == "fifo" else "cannot read the saved tensors: its header describes"
    assert "DumpError" in err and said in err and tensors.name in err, err


def test_two_saves_into_one_folder_at_once_leave_one_of_the_two_whole(tmp_path):
    # Both wrote one shared "result.json.tmp": 6-12 of 20 folders held a JSON mixed of the two.
    import threading

    results = [nbdiff.auto_diff(_net("torch"), _net("paddle", eps=e), X) for e in (1e-5, 1e-3)]
    wrong = []
    for k in range(20):
        path = tmp_path / f"r{k}"
        threads = [threading.Thread(target=r.save, args=(str(path),)) for r in results]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        loaded = nbdiff.load(str(path))
        if loaded.report().splitlines()[:4] not in [r.report().splitlines()[:4] for r in results]:
            wrong.append(k)
        assert not [p.name for p in path.iterdir() if p.name.endswith(".tmp")]
    assert wrong == []
