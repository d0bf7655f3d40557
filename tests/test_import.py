"""`import nbdiff` must not import either framework: users of one should not pay for the other."""

import subprocess
import sys


def test_import_nbdiff_imports_neither_framework():
    code = "import nbdiff, sys; print('torch' in sys.modules, 'paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
