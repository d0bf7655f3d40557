"""Notebook cells carried with a saved result or a dump: read back in another process, a frame of a
cell says ``Cell In [N], line L`` and shows its source."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("IPython")

from nbdiff.errors import DumpError  # noqa: E402
from nbdiff.trace.origin.cells import remember_cells  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# A kernel names its cells by files in a folder of its own (ipykernel's XCachingCompiler): so does this shell.
KERNEL = """
import sys
sys.path.insert(0, {repo!r})
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.compile.get_code_name = lambda raw, code, number: f"/tmp/ipykernel_4242/{{abs(hash(code))}}.py"
cells = [
    "import numpy as np\\nimport torch",
    '''
class Net(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.fc, self.scale = torch.nn.Linear(4, 4), scale

    def forward(self, x):
        h = self.fc(x)
        return torch.tanh(h * self.scale)
''',
    "import nbdiff\\ntorch.manual_seed(0)\\nbase, raw = Net(1.0), Net(1.01)\\nraw.load_state_dict(base.state_dict())",
    "result = nbdiff.auto_diff(base, raw, np.ones((2, 4), 'float32'))",
    "result.save({saved!r})",
    '''
with nbdiff.record(raw, {dump!r}):
    raw(torch.ones(2, 4)).sum().backward()
''',
]
for text in cells:
    assert shell.run_cell(text, store_history=True).success, text
print(shell.user_ns["result"].report())
"""

ELSEWHERE = """
import sys
sys.path.insert(0, {repo!r})
import nbdiff
from nbdiff.trace.dump.store import read_dump
from nbdiff.view.sources import source_excerpt
result = nbdiff.load({saved!r})
print(result.report())
frame = result.first_divergence.raw_stack[0]
shown = source_excerpt(frame.filename, frame.lineno)
print("SOURCE", shown["kind"], "|".join(shown["lines"]))
step = read_dump({dump!r} + "/rank0").steps[0]
frames = [f for e in step for f in e.stack]
from nbdiff.trace.origin.stack import frame_label
print("DUMP", sorted({{frame_label(f.filename, f.lineno) for f in frames}}))
"""


def test_a_saved_result_and_a_dump_carry_their_cells_to_another_process(tmp_path):
    paths = dict(repo=str(REPO), saved=str(tmp_path / "saved"), dump=str(tmp_path / "dump"))
    run = subprocess.run([sys.executable, "-c", KERNEL.format(**paths)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Cell In [2], line 7, in forward" in run.stdout, run.stdout  # the line calling fc
    run = subprocess.run([sys.executable, "-c", ELSEWHERE.format(**paths)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # The frame says which cell, not the kernel's file name, and its source came with the result.
    assert "Cell In [2], line 7, in forward" in run.stdout and "ipykernel_4242" not in run.stdout, run.stdout
    assert "SOURCE cell" in run.stdout and "return torch.tanh(h * self.scale)" in run.stdout, run.stdout
    dump = next(line for line in run.stdout.splitlines() if line.startswith("DUMP"))
    assert "Cell In [6], line" in dump and "ipykernel" not in dump, dump


@pytest.mark.parametrize(
    "cells",
    [
        [],
        {"/tmp/ipykernel_1/1.py": {"cell": -1, "lines": ["x"]}},
        {"/tmp/ipykernel_1/1.py": {"cell": 3, "lines": "x = 1"}},
        {"/tmp/ipykernel_1/1.py": {"cell": 3, "lines": [7]}},
        {"/tmp/ipykernel_1/1.py": {"cell": True, "lines": ["x"]}},
        {"/etc/passwd": {"cell": 3, "lines": ["x"]}},
        {"/home/me/project/ipykernel_notes/model.py": {"cell": 3, "lines": ["x"]}},
    ],
)
def test_cells_that_do_not_fit_are_refused_naming_the_file(cells):
    with pytest.raises(DumpError, match="result.json"):
        remember_cells(cells, "run1/result.json")
