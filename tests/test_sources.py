"""Source excerpts for stack frames: files, notebook cells, and missing sources."""

import linecache
import os

from nbdiff.view.sources import source_excerpt


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


def test_files_a_dump_names_outside_the_project_are_not_read(tmp_path):
    # A tampered dump's stack frame named /etc/passwd, and clicking it showed the file.
    secret = tmp_path / "secret.txt"
    secret.write_text("password\n")
    assert source_excerpt(str(secret), 1)["kind"] == "missing"
    assert source_excerpt("/etc/passwd", 1)["kind"] == "missing"
    outside = tmp_path / "other_project.py"
    outside.write_text("x = 1\n")
    assert source_excerpt(str(outside), 1)["kind"] == "missing"
    # A module this process loaded is readable, wherever it lives.
    assert source_excerpt(os.__file__, 1)["kind"] == "file"


def test_a_span_of_lines_is_all_in_the_excerpt():
    here = os.path.abspath(__file__)
    src = source_excerpt(here, 40, context=2, since=30)
    assert (src["since"], src["line"], src["first"]) == (30, 40, 28)
    assert len(src["lines"]) >= 40 - 28 + 1
    # A span that does not end at the line (or starts before line 1) is the line alone.
    assert source_excerpt(here, 10, since=12)["since"] == 10
    assert source_excerpt(here, 10, since=0)["since"] == 10


def test_a_cell_frame_standing_for_several_lines_says_all_of_them():
    # The source box's title said "line 24" for a code blame's frame of lines 20-24.
    name = "<ipython-input-9-0123456789ab>"
    linecache.cache[name] = (30, None, [f"x{i} = {i}\n" for i in range(1, 30)], name)
    assert source_excerpt(name, 24, since=20)["label"] == "Cell In [9], lines 20-24"
    assert source_excerpt(name, 24)["label"] == "Cell In [9], line 24"
