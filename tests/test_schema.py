"""A dump is untrusted input: every malformed manifest is a DumpError naming the file and key."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("safetensors")

from nbdiff.cli import main  # noqa: E402
from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from nbdiff.trace.dump.writer import write_rank  # noqa: E402
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord  # noqa: E402


def _dump(folder, dump_type="tensor", framework="torch"):
    x = np.ones((2, 2), "float32")
    out = (TensorRecord("out", (2, 2), "float32", x),)
    events = [
        Event(0, Phase.FORWARD, Kind.LAYER, 0, "", "Net", 0, 0, None, False, (), out),
        Event(0, Phase.FORWARD, Kind.LAYER, 1, "fc", "Linear", 0, 1, 0, True, (), out),
        Event(0, Phase.BACKWARD, Kind.LAYER, 0, "fc", "Linear", 0, 1, None, True, out, out,
              params=(TensorRecord("weight", (2, 2), "float32", x),)),
    ]  # fmt: skip
    meta = dict(framework=framework, model="Net", rank=0)
    return write_rank(folder / "rank0", meta, {"fc": ["Linear"]}, [events], dump_type)


def _edit(folder, change, file="manifest.json"):
    path = folder / file
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set(path, value):
    def change(data):
        *head, last = path
        for k in head:
            data = data[k]
        data[last] = value

    return change


def _edit_path(folder, path, value):
    """``["steps", k, ...]`` lives in ``step{k}.json``; the rest in the manifest."""
    if path[0] == "steps" and len(path) > 2:
        _edit(folder, _set(path[2:], value), f"step{path[1]}.json")
    else:
        _edit(folder, _set(path, value))


@pytest.mark.parametrize(
    "path, value, says",
    [
        (["steps"], "3", "steps must be an integer"),
        (["steps"], 5, "says 5 steps, but"),
        (["steps", 0, "payload"], 7, "step0.json: the step.payload must be a file name"),
        (["layers"], ["fc"], "layers must be an object"),
        (["layer_facts"], {"fc": {"num_kv_heads": [2]}}, "layer_facts['fc']['num_kv_heads'] is [2]"),
        (["layer_facts"], {"fc": 3}, "layer_facts['fc'] must be an object"),
        (["param_layouts"], {"fc": {"weight": "diagonal"}}, "param_layouts['fc']['weight'] must be shard(d)"),
        (["param_layouts"], {"fc": {"weight": "shard(x)"}}, "param_layouts['fc']['weight'] must be shard(d)"),
        (["steps", 0, "events", 0, "outputs", 0, "layout"], "shard(-1)", "layout must be shard(d)"),
        (["layer_args"], {"fc": {"eps": {"x": 1}}}, "layer_args['fc']['eps'] is {'x': 1}"),
        (["layer_args"], {"fc": [1]}, "layer_args['fc'] must be an object"),
        (["rank"], "../../x", "rank must be an integer"),
        (["framework"], "jax", "framework is 'jax'"),
        (["steps", 0, "events", 1, "parent"], "0", "the step.events[1].parent must be an integer"),
        (["steps", 0, "events", 1, "outputs", 0, "shape"], [2, -1], "outputs[0].shape must be at least 0"),
        (["steps", 0, "events", 0, "phase"], "sideways", "the step.events[0].phase is 'sideways'"),
        (["steps", 0, "events", 1, "depth"], 10**9, "depth is 1000000000; no model nests calls deeper than 10000"),
        (["steps", 0, "events", 1, "stack"], [["f.py", "x", "g"]], "the step.events[1].stack[0] must be an integer"),
        (["steps", 0, "events", 1, "outputs", 0, "sample"], [1.0], "outputs[0].sample must be an object"),
        (["steps", 0, "events", 1, "outputs", 0, "sample"], {"dtype": "object", "base64": ""}, "sample is {'dtype'"),
        (["steps", 0, "events", 1, "outputs", 0, "sample"], {"dtype": "float32", "base64": "%%"}, "does not decode"),
        # 5 values claimed for a tensor of 4: a sample is never larger than its tensor
        (["steps", 0, "events", 1, "outputs", 0, "sample"], {"dtype": "float32", "base64": "A" * 28}, "has 1 to 4"),
    ],
)
def test_malformed_fields_name_the_key(tmp_path, path, value, says):
    folder = _dump(tmp_path)
    _edit_path(folder, path, value)
    with pytest.raises(DumpError) as err:
        read_dump(folder)
    file = f"step{path[1]}.json" if path[0] == "steps" and len(path) > 2 else "manifest.json"
    assert str(folder / file) in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["../../x.safetensors", "/etc/passwd", "sub/step0.safetensors", ".."])
def test_payloads_outside_the_rank_folder_are_refused(tmp_path, name):
    folder = _dump(tmp_path)
    _edit_path(folder, ["steps", 0, "payload"], name)
    with pytest.raises(DumpError, match="step0.json: the step.payload is"):
        read_dump(folder)


def test_a_symlinked_payload_leading_out_is_refused(tmp_path):
    folder = _dump(tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    (folder / "step0.safetensors").rename(outside)
    os.symlink(outside, folder / "step0.safetensors")
    with pytest.raises(DumpError, match="leads outside"):
        read_dump(folder)


@pytest.mark.parametrize("parents", [[1, 1], [1, 0]])
def test_parent_cycles_are_refused_not_followed(tmp_path, parents):
    # A self-parent or a loop hung compare (past 90 s and 5 GB in pairing's ancestor walk).
    folder = _dump(tmp_path)

    def change(data):
        for e, p in zip(data["events"], parents):
            e["parent"] = p

    _edit(folder, change, "step0.json")
    with pytest.raises(DumpError, match="parent chain"):
        read_dump(folder)


def test_deeply_nested_json_is_a_dump_error(tmp_path):
    folder = _dump(tmp_path)
    (folder / "manifest.json").write_text('{"format": "nbdiff-dump", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(DumpError, match="nested too deeply"):
        read_dump(folder)


def test_claimed_shapes_allocate_nothing(tmp_path):
    # Statistics dumps carry shapes but no values: a 50000 x 50000 claim was an 18.6 GiB np.full.
    import resource

    from nbdiff.offline import compare

    a, b = _dump(tmp_path / "a", "statistics"), _dump(tmp_path / "b", "statistics", framework="paddle")
    for folder in (a, b):  # the weight's layout is converted between the frameworks: its claim is followed
        _edit_path(folder, ["steps", 0, "events", 2, "params", 0, "shape"], [50000, 50000])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = compare(tmp_path / "a", tmp_path / "b")
    assert any(t.name == "weight" for d in result.events for t in d.tensors)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB: well under 18 GiB


def test_cli_exits_2_on_a_malformed_dump(tmp_path, capsys):
    _dump(tmp_path / "a")
    _dump(tmp_path / "b")
    _edit(tmp_path / "b" / "rank0", _set(["steps"], "3"))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "DumpError" in err and "steps must be an integer" in err and "Traceback" not in err


def test_version_1_dumps_with_inline_steps_are_still_read(tmp_path):
    folder = _dump(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    step = json.loads((folder / "step0.json").read_text())
    (folder / "step0.json").unlink()
    manifest.update(version=1, steps=[step])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    dump = read_dump(folder)
    assert len(dump.steps) == 1 and [e.path for e in dump.steps[0]][:2] == ["", "fc"]
