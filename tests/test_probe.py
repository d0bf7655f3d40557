"""pair_once: the one "run both models once and pair" under LayerMap.auto, check_config and assign_weight."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.align.probe import pair_once  # noqa: E402
from tests.structure_models import decoders  # noqa: E402

X = np.random.RandomState(0).randn(2, 1, 8).astype("float32")


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_both_decoders_are_paired_and_keep_their_cache_and_counter(direction):
    base, raw = decoders(direction)
    pairing = pair_once(base, raw, X)
    assert [(p.base.path, p.raw.path) for p in pairing.pairs] == [
        ("", ""),
        ("qkv", "qkv"),
        ("proj", "proj"),
        ("head", "head"),
    ]
    assert (base.calls, len(base.cache), raw.calls, len(raw.cache)) == (0, 0, 0, 0)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_the_verbs_that_pair_before_a_run_leave_a_stateful_model_as_they_found_it(direction):
    base, raw = decoders(direction)
    nbdiff.LayerMap.auto(base, raw, X)
    nbdiff.check_config(base, raw, X)
    nbdiff.assign_weight(base, raw, inputs=X)
    assert (base.calls, len(base.cache), raw.calls, len(raw.cache)) == (0, 0, 0, 0)
