"""The engine: one step of two models, compared and blamed, and the one driver every verb runs.

How a step is compared (each stage a module):

1. **Run and record** (:mod:`~nbdiff.engine.stepping`): one model's forward, loss and backward,
   recorded as events; ``single_step`` feeds raw base's inputs (:mod:`~nbdiff.engine.live.feed`).
2. **Pair and plan** (:class:`~nbdiff.engine.comparer.StepComparer`): the two steps' layer calls
   are paired; the first step's pairing decides the weight plans (which tensors of a base layer are
   which of raw's) and notes constants that differ (:mod:`~nbdiff.engine.constants`).
3. **Compare**: forward outputs, inputs and loss (:mod:`~nbdiff.engine.forward`), gradients
   (:mod:`~nbdiff.engine.backward`), optimizer updates (:mod:`~nbdiff.engine.training.updates`), running
   statistics (:mod:`~nbdiff.engine.training.state`); base's layout is converted to raw's by the plans
   (:mod:`~nbdiff.engine.layouts`).
4. **Blame**: every own error is a finding. Its local error comes from the kind of step: a live
   one replays the layer on base's inputs (:mod:`~nbdiff.engine.replay`,
   :class:`~nbdiff.engine.live.comparer.LiveComparer`); a recorded one judges it from the dump
   (:class:`~nbdiff.engine.recorded.comparer.RecordedComparer`). Rounding that a computation amplifies
   (:mod:`~nbdiff.engine.conditioning`) and weights that drifted through agreeing updates
   (:mod:`~nbdiff.engine.training.drift`) are notes, not findings.
5. **Verdict** (:class:`~nbdiff.engine.driver.Verdict`): each step's comparison is kept; the first
   step that diverges is the answer, and the result is explained (:mod:`~nbdiff.engine.explain`:
   the arguments and optimizer settings that differ).

The verbs (``auto_diff``, ``watch``, ``compare``) are "check the options
(:mod:`~nbdiff.engine.options`), copy the weights, loop over the steps, the verdict's result".
A new comparison goes into the comparer (so live and recorded steps both get it); a new verb
builds a comparer and a verdict.
"""
