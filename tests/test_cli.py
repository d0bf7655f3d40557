"""`nbdiff compare A B`: report, exit status, HTML and CSV outputs, help."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

from nbdiff.cli import main  # noqa: E402
from tests.dumps import momentum_pair, pair, record_training, train  # noqa: E402


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    base, raw = pair()
    train(base, root / "a", steps=2)
    train(raw, root / "b", steps=2)
    base, raw = pair("eps")
    train(base, root / "c", steps=2)
    train(raw, root / "d", steps=2)
    return root


def test_exit_status_is_0_aligned_1_diverged_2_error(dumps, capsys):
    assert main(["compare", str(dumps / "a"), str(dumps / "b")]) == 0
    assert "SUCCESS" in capsys.readouterr().out
    assert main(["compare", str(dumps / "c"), str(dumps / "d"), "--atol", "1e-3", "--mode", "mean"]) in (0, 1)
    assert main(["compare", str(dumps / "c"), str(dumps / "d")]) == 1
    assert "layer `norm`" in capsys.readouterr().out
    assert main(["compare", str(dumps / "a"), str(dumps / "missing")]) == 2
    assert "no nbdiff dump here" in capsys.readouterr().err
    assert main(["compare", str(dumps / "a")]) == 2  # argparse: missing B


def test_html_and_csv_outputs(dumps, tmp_path):
    html, tables = tmp_path / "r.html", tmp_path / "tables"
    assert main(["compare", str(dumps / "c"), str(dumps / "d"), "--html", str(html), "--csv", str(tables)]) == 1
    assert html.read_text().startswith("<!doctype html>")
    names = sorted(p.name for p in tables.iterdir())
    assert {"mapping_0.csv", "forward_compare_0.csv", "backward_compare_1.csv", "optimizer_compare_1.csv"} <= set(names)


def test_help_documents_every_option():
    out = subprocess.run([sys.executable, "-m", "nbdiff", "compare", "--help"], capture_output=True, text=True).stdout
    for flag in ("--html", "--csv", "--atol", "--rtol", "--mode", "--ignore-unmatched", "--keep-steps"):
        assert flag in out
    top = subprocess.run([sys.executable, "-m", "nbdiff", "--help"], capture_output=True, text=True)
    assert top.returncode == 0 and "Exit status: 0 aligned, 1 diverged, 2 error" in top.stdout


def test_keep_steps_bounds_the_steps_kept_event_by_event(dumps, tmp_path, capsys):
    assert main(["compare", str(dumps / "a"), str(dumps / "b"), "--keep-steps", "1", "--csv", str(tmp_path)]) == 0
    assert "1 step(s) from step 1 on are summarised" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mapping")) == ["mapping_0.csv"]


def test_a_tolerance_that_would_pass_anything_is_an_error(dumps, capsys):
    assert main(["compare", str(dumps / "c"), str(dumps / "d"), "--atol", "inf"]) == 2
    assert "atol=inf" in capsys.readouterr().err
    assert main(["compare", str(dumps / "c"), str(dumps / "d"), "--rtol", "-1"]) == 2


def test_shards_take_path_equals_rule_and_say_what_is_wrong(dumps, capsys):
    assert main(["compare", str(dumps / "c"), str(dumps / "d"), "--shards", "fc"]) == 2
    assert "--shards 'fc': expected PATH=RULE" in capsys.readouterr().err
    assert main(["compare", str(dumps / "c"), str(dumps / "d"), "--shards", "fc=diagonal"]) == 2
    assert "no shard rule 'diagonal'" in capsys.readouterr().err


def test_compare_fails_on_a_verified_framework_difference_only_when_asked(tmp_path, capsys):
    # --framework-differences was auto_diff's only; the report of every verb told the user to set it.
    t, p = momentum_pair(None)
    import nbdiff

    nbdiff.assign_weight(t, p)
    a, b = record_training(t, tmp_path / "a", "tensor", steps=1), record_training(p, tmp_path / "b", "tensor", 1)
    assert main(["compare", str(a), str(b)]) == 0
    assert main(["compare", str(a), str(b), "--framework-differences", "fail"]) == 1
    assert "running_var" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--framework-differences", "maybe"]) == 2  # argparse: a bad choice
