"""`import nbdiff` must not import either framework: users of one should not pay for the other."""

import subprocess
import sys


def test_import_nbdiff_imports_neither_framework():
    code = "import nbdiff, sys; print('torch' in sys.modules, 'paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_module_is_reached_by_its_dotted_name_after_import_nbdiff():
    # The function nbdiff.compare shadowed the package nbdiff.compare: `import nbdiff.compare.metrics
    # as m` raised ImportError, and `import nbdiff.record as r` gave the class, not the module.
    code = """
import importlib, pkgutil, sys
import nbdiff
for m in pkgutil.walk_packages(nbdiff.__path__, "nbdiff."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
for name in sorted(n for n in sys.modules if n.startswith("nbdiff.")):
    parent, _, leaf = name.rpartition(".")
    if getattr(sys.modules[parent], leaf, None) is not sys.modules[name]:
        print(name)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []
