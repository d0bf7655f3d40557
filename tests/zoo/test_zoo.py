"""The real-model zoo with default options: every equivalent pair passes, every bug is blamed exactly.

Needs transformers and paddleformers (``make test`` installs them); without them the
Llama cases skip and say why. See ``python -m tests.zoo.run`` for the table.
"""

import importlib.util

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.zoo.pairs import CASES  # noqa: E402

_HAVE_HF = all(importlib.util.find_spec(m) for m in ("transformers", "paddleformers"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_zoo_case(case):
    if case.name.startswith("llama") and not _HAVE_HF:
        pytest.skip("transformers and paddleformers are not installed (make test installs them)")
    base, raw, inputs, options = case.build()
    result = nbdiff.auto_diff(base, raw, inputs, **options)
    if case.expect is None:
        assert result, result.report()
        return
    d = result.first_divergence
    assert d is not None, result.report()
    phase, path, parameter = case.expect
    assert (d.phase.value, d.base_path) == (phase, path), result.report()
    if parameter is not None:
        assert d.parameter == parameter, result.report()
