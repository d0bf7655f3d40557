"""The one driver's verdict: which step's findings are the answer, and what else is kept."""

from types import SimpleNamespace

from nbdiff.engine.comparer import StepComparison
from nbdiff.engine.driver import Verdict


def _finding(where, name):
    # The verdict reads only ``where``; a stand-in keeps the test about the bookkeeping.
    return SimpleNamespace(where=where, name=name)


def test_a_framework_difference_is_kept_but_fails_only_when_asked():
    verdict = Verdict()
    running_var = _finding("framework", "bn.running_var")
    assert not verdict.step_done(0, [running_var])
    assert verdict.divergence is None and verdict.findings == [running_var]
    bug = _finding("layer", "fc")
    assert verdict.step_done(1, [bug, _finding("layer", "head")])
    assert verdict.divergence is bug
    assert [f.name for f in verdict.findings] == ["bn.running_var", "fc", "head"]  # every finding of step 1
    strict = Verdict(framework_fails=True)
    assert strict.step_done(0, [running_var]) and strict.divergence is running_var


def test_the_earliest_step_then_the_lowest_rank_is_the_answer_whatever_the_order_compared():
    # compare goes rank by rank: rank 1's step 0 is compared after rank 0's step 3.
    verdict = Verdict()
    late, early = _finding("layer", "rank0 step3"), _finding("layer", "rank1 step0")
    verdict.step_done(3, [late], rank=0)
    verdict.step_done(0, [early], rank=1)
    assert verdict.divergence is early and verdict.at == (0, 1) and verdict.findings == [early]
    verdict.step_done(0, [_finding("layer", "rank2 step0")], rank=2)
    assert verdict.divergence is early


def test_comparisons_leave_their_pairs_and_notes_with_the_verdict():
    verdict, kept_apart = Verdict(), Verdict(keep_events=False)
    step = StepComparison([_finding("layer", "fc")], ["pair"], ["a note"])
    assert verdict.add(step) == step.findings and kept_apart.add(step) == step.findings
    assert (verdict.events, verdict.warnings) == (["pair"], ["a note"])
    assert (kept_apart.events, kept_apart.warnings) == ([], ["a note"])


def test_a_whole_step_taken_keeps_every_part_and_judges_its_findings_or_those_the_caller_placed():
    from nbdiff.engine.comparer import WholeStep

    fwd, update = _finding("layer", "fc"), _finding("parameter", "fc.weight")
    whole = WholeStep(
        "pairing", (StepComparison(notes=["paired"]), StepComparison([fwd], ["d"]), StepComparison([update], [], ["u"]))
    )
    verdict = Verdict()
    assert verdict.take(0, whole)
    assert verdict.divergence is fwd and verdict.findings == [fwd, update]
    assert (verdict.events, verdict.warnings) == (["d"], ["paired", "u"])
    placed = _finding("layer", "fc on rank 1")
    other = Verdict()
    assert other.take(0, whole, rank=1, findings=[placed]) and other.divergence is placed and other.at == (0, 1)
