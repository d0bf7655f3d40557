"""The parity matrix: every bug kind of the fault suite, running statistics, a weight written outside the
optimizer and a parameter group's learning rate, through ``auto_diff``, ``watch`` and record + compare
(tensor and statistics dumps), both directions: the same first divergence, and the same findings.

Where a dump cannot tell, the expected answer says so:

- a layer already blamed in a step's forward: whether its backward is an own error too is measured
  live by a replay, and from a dump only where the layer can be rebuilt on base's values (not from
  statistics, not a class made in a function); so a dump's backward findings at such a layer are not
  held to the live ones;
- an update behind a gradient that differed: a statistics dump keeps no values to read each side's
  step size from (:mod:`nbdiff.engine.training.step_size`), so it may not name it.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

from tests.parity import CASES, VERBS, findings, run  # noqa: E402


def _expected(reference: list[tuple], verb: str, got: list[tuple]) -> tuple[set, set]:
    """``reference`` and ``got`` as sets, less what ``verb`` is not held to (see the module's note)."""
    ref, mine = set(reference), set(got)
    if verb.startswith("compare"):
        blamed = {(s, path) for s, phase, path, _ in ref | mine if phase == "forward"}
        behind = lambda f: f[1] == "backward" and (f[0], f[2]) in blamed  # noqa: E731
        ref, mine = {f for f in ref if not behind(f)}, {f for f in mine if not behind(f)}
    if verb == "compare statistics" and any(f[1] in ("forward", "backward") for f in ref):
        ref = {f for f in ref if f[1] != "optimizer" or f in mine}
    return ref, mine


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_verb_finds_what_the_others_find(case, direction, tmp_path):
    verbs = [v for v in VERBS if not (v == "auto_diff" and case.written != 1.0)]  # no user code runs between its steps
    got = {verb: findings(run(case, direction, verb, tmp_path / verb.replace(" ", "_"))) for verb in verbs}
    reference = got[verbs[0]]
    assert reference[:1] == [case.blame], f"{verbs[0]}: {reference}"
    for verb in verbs[1:]:
        assert got[verb][:1] == reference[:1], f"{verb}: first divergence {got[verb][:1]}, {verbs[0]}: {reference[:1]}"
        expected, mine = _expected(reference, verb, got[verb])
        assert mine == expected, f"{verb}: {sorted(mine)}, {verbs[0]}: {sorted(expected)}"
