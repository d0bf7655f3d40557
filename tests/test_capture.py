"""What a recording keeps of a big model: layers by pattern or depth, some steps, some layers' tensors."""

import pytest

from nbdiff.errors import OptionError
from nbdiff.trace.capture import Capture

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from tests.dumps import pair, train  # noqa: E402


@pytest.mark.parametrize(
    "options, says",
    [
        (dict(depth=-1), "depth=-1"),
        (dict(depth=True), "depth=True"),
        (dict(steps=True), "steps=True"),
        (dict(steps=-2), "steps=-2"),
        (dict(steps=["a"]), "steps=['a']"),
        (dict(layers=[]), "layers=[]"),
        (dict(tensors=[3]), "tensors=[3]"),
    ],
)
def test_bad_options_name_themselves_and_the_fix(options, says):
    with pytest.raises(OptionError, match="expected") as err:
        Capture.of(**options)
    assert says in str(err.value)


def _layers(path, step=0):
    return {(e.phase.value, e.path) for e in read_dump(path).steps[step]}


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_layers_by_pattern_and_by_depth(tmp_path, base_fw, raw_fw):
    base, _ = pair(base_fw=base_fw, raw_fw=raw_fw)
    kept = _layers(train(base, tmp_path / "p", steps=1, layers=["fc*"]))
    assert {p for _, p in kept} == {"fc1", "fc2", "fc3"}
    # and the weights a layer kept is rebuilt with offline (engine/rebuilt)
    assert {ph for ph, p in kept if p == "fc1"} == {"forward", "backward", "optimizer", "weights"}
    shallow = {p for _, p in _layers(train(base, tmp_path / "d", steps=1, depth=0))}
    assert "" in shallow and not shallow & {"fc1", "norm"}


def test_only_the_steps_asked_for_are_written_and_keep_their_numbers(tmp_path):
    # Both sides keep every other step; the bug that starts at step 2 is found at step 2.
    base, raw = pair()
    a = train(base, tmp_path / "a", steps=4, record_steps=range(0, 4, 2))
    b = train(raw, tmp_path / "b", steps=4, record_steps=range(0, 4, 2), late_bug_at=2)
    assert len(read_dump(a).steps) == 2 and {e.step for e in read_dump(a).steps[1]} == {2}
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert (d.step, d.base_path) == (2, "fc2")
    assert len(read_dump(train(base, tmp_path / "c", steps=3, record_steps=1)).steps) == 1


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_second_recording_keeps_the_tensors_of_what_the_first_comparison_blamed(tmp_path, base_fw, raw_fw):
    base, raw = pair("eps", base_fw=base_fw, raw_fw=raw_fw)
    first = nbdiff.compare(
        train(base, tmp_path / "a", steps=1, dump_type="statistics").parent,
        train(raw, tmp_path / "b", steps=1, dump_type="statistics").parent,
    )
    assert first.blamed_paths("base") == first.blamed_paths("raw") == ["norm"]
    step = [first.first_divergence.step]
    a = train(base, tmp_path / "c", steps=1, record_steps=step, tensors=first.blamed_paths("base"))
    b = train(raw, tmp_path / "d", steps=1, record_steps=step, tensors=first.blamed_paths("raw"))
    with_values = {e.path for e in read_dump(a).steps[0] if any(t.value is not None for t in e.outputs)}
    assert with_values <= {"norm", "<inputs>", "<loss>"} and "norm" in with_values
    assert sum(f.stat().st_size for f in a.iterdir()) < sum(f.stat().st_size for f in (tmp_path / "a").rglob("*")) * 4
    second = nbdiff.compare(a.parent, b.parent)
    d = second.first_divergence
    assert (d.base_path, d.where) == ("norm", "layer") and second.findings[0].metrics.note == ""
