"""DiffResult.to_json and `nbdiff compare --json`: a verdict a CI job or a script can act on."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.cli import main  # noqa: E402
from tests.dumps import pair, train  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _strict(text: str) -> dict:
    """Parse as a strict JSON reader would: NaN and Infinity are not JSON."""

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_live_blame_reads_the_same_in_json(base_fw, raw_fw, tmp_path):
    base, raw = BUILDERS["mlp"](base_fw), BUILDERS["mlp"](raw_fw, "eps")
    result = nbdiff.auto_diff(base, raw, inputs("mlp"))
    doc = _strict(result.to_json(str(tmp_path / "v.json")))
    assert doc == _strict((tmp_path / "v.json").read_text())
    assert (doc["format"], doc["version"], doc["verdict"]) == ("nbdiff-verdict", 2, "diverged")
    assert doc["base"]["framework"] == base_fw and doc["raw"]["framework"] == raw_fw
    first, d = doc["first_divergence"], result.first_divergence
    assert first == doc["findings"][0]
    assert (first["phase"], first["step"], first["rank"], first["where"]) == ("forward", 0, 0, "layer")
    assert (first["base"]["path"], first["raw"]["path"], first["blame"]) == ("norm", "norm", "local")
    assert first["local_by"] == "replay"
    assert first["metrics"]["ratio"] == d.metrics.ratio > 1 and first["local_error"]["ratio"] > 1
    assert "eps" in first["why"] and {a["name"] for a in first["arguments"]} >= {"eps"}
    assert first["base"]["stack"] and {"file", "line", "function"} == set(first["base"]["stack"][0])
    assert doc["options"]["steps"] == 1


def test_an_agreeing_pair_is_aligned_with_no_finding():
    doc = _strict(nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp")).to_json())
    assert (doc["verdict"], doc["first_divergence"], doc["findings"]) == ("aligned", None, [])


def test_non_finite_numbers_are_strings_not_invalid_json():
    base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    nbdiff.assign_weight(base, raw)
    w = raw.fc1.weight
    w.set_value(np.full(w.shape, np.nan, "float32"))
    doc = _strict(nbdiff.auto_diff(base, raw, inputs("mlp"), auto_init=False).to_json())
    first = doc["first_divergence"]
    assert first["metrics"]["nan"]["raw"] > 0, first
    assert {"nan", "inf"} & {first["metrics"][k] for k in ("max_abs", "max_rel", "mean_abs", "cosine", "ratio")}


def test_the_cli_writes_the_verdict_and_can_pipe_it(tmp_path, capsys):
    base, raw = pair("eps")
    a, b = train(base, tmp_path / "a", steps=2), train(raw, tmp_path / "b", steps=2)
    assert main(["compare", str(a), str(b), "--json", str(tmp_path / "v.json")]) == 1
    written = _strict((tmp_path / "v.json").read_text())
    assert written["verdict"] == "diverged" and written["first_divergence"]["base"]["path"] == "norm"
    assert written["first_divergence"]["local_by"] == "rebuilt"  # offline: measured on norm rebuilt from the dump
    assert "JSON verdict:" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--json", "-"]) == 1
    out = capsys.readouterr()
    assert _strict(out.out) == written  # stdout is the JSON alone; the report went to stderr
    assert "layer `norm`" in out.err
