"""One recorded training step of one model: forward, loss, backward."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from nbdiff.engine.types import StepRecord
from nbdiff.errors import InputError, ModelCallError
from nbdiff.frameworks import Framework
from nbdiff.trace.inputs import CallArgs, call_model
from nbdiff.trace.nest import flatten
from nbdiff.trace.recorder import Feed, Recorder
from nbdiff.trace.spool import Spool, give_back_heap

__all__ = ["run_step", "run_optimizer", "loss_of", "loss_weights"]


@functools.lru_cache(maxsize=1)  # both sides, every step: the same n
def loss_weights(n: int) -> np.ndarray:
    """The default loss's fixed weights for ``n`` output values: ``1 + cos(k)``, the same on both sides.

    A plain mean has a zero gradient through a final LayerNorm, BatchNorm or softmax (their
    outputs sum to a constant), so nothing before them could be compared in backward. Uneven
    weights keep every gradient alive; their mean of about 1 keeps the plain mean's scale.
    """
    weights = np.arange(n, dtype=np.float32)  # float32 throughout: an LM's logits are 100M+ values
    np.cos(weights, out=weights)
    weights += 1.0
    return weights


def loss_of(fw: Framework, loss_fn: Callable[[Any], Any] | None, output: Any, side: str) -> Any:
    """The step's loss: ``loss_fn(output)``, or a fixed weighted mean of every floating output.

    The weights go by each output's place, a dict's by key: two models returning the same keys
    in another order get the same loss."""
    if loss_fn is None:
        floats = [t for _, t in flatten(_keys_sorted(output), fw.is_tensor)[0] if fw.is_floating(t)]
        if not floats:
            raise InputError(
                f"The {side} model returned no floating tensor, so there is no default loss; pass loss_fns."
            )
        return fw.weighted_mean_of(floats, loss_weights(sum(int(np.prod(fw.shape_of(t))) for t in floats)))
    try:
        loss = loss_fn(output)
    except Exception as exc:
        raise ModelCallError(f"The {side} loss function raised {type(exc).__name__}: {exc}") from exc
    if not fw.is_tensor(loss) or fw.shape_of(loss) not in ((), (1,)):
        raise InputError(f"The {side} loss function must return a scalar tensor; it returned {type(loss).__name__}.")
    return loss


def _keys_sorted(output: Any) -> Any:
    """The output with every plain dict's keys in sorted order (a ``ModelOutput`` keeps its fields')."""
    if type(output) is dict:
        return {k: _keys_sorted(output[k]) for k in sorted(output, key=str)}
    if type(output) in (tuple, list):
        return type(output)(_keys_sorted(v) for v in output)
    return output


def run_step(
    fw: Framework,
    model: Any,
    call: CallArgs,
    loss_fn: Callable[[Any], Any] | None,
    *,
    side: str,
    step: int,
    backward: bool,
    feed: Feed | None = None,
    api_level: bool | str = False,
    spool: Spool | None = None,
) -> StepRecord:
    """Run and record one step. Hooks are gone when this returns or raises."""
    rec = Recorder(fw, model, step=step, backward=backward, feed=feed, api_level=api_level, spool=spool)
    loss = None
    try:
        with rec:
            output = call_model(model, call, side)
            if backward or loss_fn is not None:
                loss = loss_of(fw, loss_fn, output, side)
            if backward:
                try:
                    fw.backward(loss)
                except Exception as exc:
                    raise ModelCallError(f"Backward of the {side} model raised {type(exc).__name__}: {exc}") from exc
    finally:
        # Again (it is whole once done): a Ctrl-C handled as ``__exit__`` began left every hook on.
        rec.remove()
        rec.remove_tensor_hooks()
    fwd, bwd, warnings = rec.events(loss)
    if spool is not None and spool.spooling:
        # The step's memory is back, but not the process's: hand both kinds to the system
        # before the other model runs, so its peak does not come on top of them.
        spool.trim()
        give_back_heap()
    return StepRecord(fwd, bwd, warnings, rec.param_grads)


def run_optimizer(fw: Framework, optimizer: Any, side: str) -> None:
    """Step a framework optimizer, or call a zero-argument callable that steps and clears."""
    try:
        if fw.is_optimizer(optimizer):
            fw.optimizer_step(optimizer)
        else:
            optimizer()
    except Exception as exc:
        raise ModelCallError(f"The {side} optimizer raised {type(exc).__name__}: {exc}") from exc
