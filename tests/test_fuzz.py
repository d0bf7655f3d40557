"""Property-based fuzz of random paired architectures (hypothesis).

Random depth, width and layer kinds, built twice in either framework, checked with default
options: an equivalent pair passes, and one injected bug is blamed at its layer.

`make test` runs a bounded, derandomized number of examples (the same ones on every run, so CI
cannot flake on a new draw). More on demand, with fresh random draws:
    NBDIFF_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest tests/test_fuzz.py
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import nbdiff  # noqa: E402
from tests.fault_suite.random_models import ACTIVATIONS, bug_sites, build, expected_blame, inputs  # noqa: E402

_ON_DEMAND = int(os.environ.get("NBDIFF_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_ON_DEMAND or 12,
    derandomize=not _ON_DEMAND,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
DIRECTIONS = st.sampled_from([("torch", "paddle"), ("paddle", "torch"), ("torch", "torch"), ("paddle", "paddle")])


@st.composite
def specs(draw) -> dict:
    image = draw(st.booleans())
    width = draw(st.sampled_from([3, 4, 8]) if image else st.sampled_from([4, 8, 16, 32]))
    # Widths from 3: a LayerNorm over 2 features outputs +-1 whatever its input, so nothing
    # before it gets a gradient, and a backward bug there would be invisible to anyone.
    weighted = st.tuples(
        st.just("conv" if image else "linear"), st.sampled_from([4, 8]) if image else st.integers(3, 32)
    )
    layer = st.one_of(
        weighted,
        st.tuples(st.just("norm")),
        st.tuples(st.just("act"), st.sampled_from(ACTIVATIONS)),
        st.tuples(st.just("tanh_custom")),
        st.tuples(st.just("dropout"), st.sampled_from([0.1, 0.5])),
        st.tuples(st.just("residual"), st.booleans()),
    )
    # It starts with a weighted layer: a model with nothing trainable is refused (tested elsewhere).
    layers = [draw(weighted)] + draw(st.lists(layer, max_size=6))
    return {
        "image": image,
        "width": width,
        "layers": layers,
        "seed": draw(st.integers(0, 2**16)),
        "reversed_side": draw(st.sampled_from(["torch", "paddle", None])),
        # Raw's top layers named m0, m1... instead of l0, l1...: pairing by order alone.
        "raw_prefix": draw(st.sampled_from(["l", "m"])),
    }


def _describe(spec: dict, direction, bug=None) -> str:
    return f"spec={spec} direction={direction} bug={bug}"


@FUZZ
@given(spec=specs(), direction=DIRECTIONS)
def test_random_equivalent_pairs_pass_with_defaults(spec, direction):
    bfw, rfw = direction
    result = nbdiff.auto_diff(build(spec, bfw), build(spec, rfw, prefix=spec["raw_prefix"]), inputs(spec))
    assert result, _describe(spec, direction) + "\n" + result.report()


@FUZZ
@given(spec=specs().filter(bug_sites), direction=DIRECTIONS, data=st.data())
def test_random_bug_is_blamed_at_its_layer(spec, direction, data):
    bfw, rfw = direction
    bug = data.draw(st.sampled_from(bug_sites(spec)), label="bug")
    result = nbdiff.auto_diff(build(spec, bfw), build(spec, rfw, bug, spec["raw_prefix"]), inputs(spec))
    d = result.first_divergence
    about = _describe(spec, direction, bug) + "\n" + result.report()
    assert d is not None, about
    assert (d.phase.value, d.base_path) == expected_blame(bug), about
    assert d.where == "layer" and not d.inherited, about
