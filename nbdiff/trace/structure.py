"""The layer calls of one forward pass, for pairing only: no gradients, nothing changed."""

from __future__ import annotations

from typing import Any

from nbdiff.frameworks import Framework
from nbdiff.trace.events import Event
from nbdiff.trace.inputs import CallArgs, call_model
from nbdiff.trace.modes import eval_mode, kept_state
from nbdiff.trace.recorder import Recorder
from nbdiff.trace.user_state import kept_user_state

__all__ = ["forward_structure"]


def forward_structure(
    fw: Framework, model: Any, call: CallArgs, side: str, *, train: bool = False, root: bool = True
) -> list[Event]:
    """Forward layer events of one no-grad call, in execution order.

    In eval mode by default. ``train=True`` keeps the model's modes (a step's control
    flow may depend on them) and restores its running statistics afterwards.
    ``root=False`` leaves the root model unhooked (for a call made from its own hook).
    """
    modes = kept_state(fw, model) if train else eval_mode(fw, model)
    keep = None if root else (lambda path, layer: path != "")
    # The user's own state (a KV cache, a counter) is put back: this call is nbdiff's, not the user's.
    with modes, kept_user_state(fw, model), fw.no_grad():
        rec = Recorder(fw, model, backward=False, stacks=False, keep=keep)
        try:
            with rec:
                call_model(model, call, side)
        finally:
            rec.remove()  # again: a Ctrl-C handled as ``__exit__`` began left every hook on
    forward, _, _ = rec.events()
    return forward
