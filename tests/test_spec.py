"""engine/spec: one comparison's options, checked once, and the flags made from them."""

import argparse

import pytest

from nbdiff.engine.kept import KEEP_STEPS
from nbdiff.engine.spec import Comparison, add_flags, from_flags
from nbdiff.errors import OptionError
from nbdiff.judge.tolerance import resolve_tolerance


def test_a_comparison_is_checked_when_made_and_gives_the_tolerance():
    spec = Comparison(atol=1e-3)
    assert spec.tol("float32", "float32") == resolve_tolerance(1e-3, None, "float32", "float32")
    for bad, word in (
        (dict(atol=float("inf")), "atol=inf"),
        (dict(rtol=-1.0), "rtol=-1.0"),
        (dict(compare_mode="loose"), "compare_mode='loose'"),
        (dict(diff_phase="update"), "diff_phase='update'"),
        (dict(framework_differences="ignore"), "framework_differences='ignore'"),
        (dict(keep_steps=-1), "keep_steps=-1"),
    ):
        with pytest.raises(OptionError, match=word):
            Comparison(**bad)


def test_the_cli_and_the_magics_take_their_flags_choices_and_defaults_from_the_comparison():
    from nbdiff.cli import _parser as cli_parser
    from nbdiff.notebook.magics import parse_flags

    cli = cli_parser().parse_args(["compare", "a", "b"])
    cell = parse_flags("tm pm", cell=True)
    defaults = Comparison()
    for parsed in (cli, cell):
        got = from_flags(parsed)
        assert got["compare_mode"] == defaults.compare_mode and got["framework_differences"] == "report"
        assert got["keep_steps"] == KEEP_STEPS and got["atol"] is None
    assert from_flags(parse_flags("tm pm --phase forward --mode mean", cell=False)) == dict(
        atol=None, rtol=None, compare_mode="mean", diff_phase="forward", framework_differences="report"
    )
    with pytest.raises(OptionError):
        parse_flags("tm pm --framework-differences ignore", cell=True)  # a choice the comparison does not know
    parser = argparse.ArgumentParser()
    add_flags(parser, "diff_phase")
    assert parser.parse_args([]).diff_phase == "both"
