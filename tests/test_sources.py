"""Source excerpts for stack frames: files, notebook cells, and missing sources."""

import linecache
import os

from nbdiff.notebook.sources import source_excerpt


def test_file_excerpt_around_the_line_with_a_relative_path():
    here = os.path.abspath(__file__)
    s = source_excerpt(here, 5, context=2)
    assert s["kind"] == "file" and s["first"] == 3 and len(s["lines"]) == 5
    assert s["lines"][2] == open(here).read().splitlines()[4]
    assert s["relpath"] is None or not s["relpath"].startswith("..")


def test_notebook_cell_is_shown_whole():
    name = "<ipython-input-7-0123456789ab>"
    linecache.cache[name] = (30, None, ["a = 1\n", "b = model(x)\n", "c = 3\n"], name)
    s = source_excerpt(name, 2)
    assert s["kind"] == "cell" and s["lines"] == ["a = 1", "b = model(x)", "c = 3"] and s["line"] == 2


def test_missing_source_is_reported_not_raised():
    assert source_excerpt("/nonexistent/file.py", 3)["kind"] == "missing"
