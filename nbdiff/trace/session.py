"""Recording one model across the steps of the user's own code."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from nbdiff.frameworks import Framework, Handle
from nbdiff.frameworks.interrupts import interrupts_deferred
from nbdiff.trace.modes import no_dropout, training_flags
from nbdiff.trace.recorder import Recorder

__all__ = ["ModelSession", "Weights"]

Weights = dict[int, np.ndarray]
"""Trainable tensors (or their gradients) by ``id`` of the parameter."""


class ModelSession:
    """One model recorded while the user's code runs it: layer calls, gradients, weights per step.

    Each call of the root model starts a step. ``weights`` holds the trainable tensors at the
    start of every step (and, after :meth:`end`, at the end); ``grads`` the parameter
    gradients of each step, summed over its backward passes.
    """

    def __init__(self, fw: Framework, model: Any, name: str, backward: bool, **recorder_options: Any) -> None:
        self.fw, self.model, self.name = fw, model, name
        self.recorder = Recorder(fw, model, backward=backward, **recorder_options)
        self.params = [p for _, lay in fw.named_layers(model) for _, p in fw.direct_params(lay) if fw.is_trainable(p)]
        self.steps = 0
        self.weights: list[Weights] = []
        """Trainable tensors at the start of each step, then at the end."""
        self.grads: list[Weights] = []
        """Parameter gradients of each step, summed over its backward passes."""
        self.states: list[Weights] = []
        """Non-trainable tensors (running statistics, counters) at the start of each step, then at the end."""
        self._state_tensors = [
            t for _, lay in fw.named_layers(model) for _, t in fw.direct_params(lay) + fw.direct_buffers(lay)
            if not fw.is_trainable(t)
        ]  # fmt: skip
        self.outside: list[dict[int, float]] = []
        """Per step start (then the end): the parameters an optimizer stepped that were written since,
        outside it (weight clipping, an EMA, a manual write), each with its norm after over before."""
        self._stepped: dict[int, tuple[int, float]] = {}  # as the optimizers left them: checksum, norm
        self.dropout_off: list[str] = []
        """The dropout rates set to 0 while hooked (``"drop.p=0.3"``): the user's run is not the same."""

    def install(
        self, stack: ExitStack, on_root: Callable[..., Any], after_root: Callable[..., Any] | None = None
    ) -> None:
        """Hook the model until ``stack`` closes: dropout off, modes kept, ``on_root`` before each
        call of the model (and ``after_root`` after it)."""
        fw = self.fw
        # Each hook and what removes it go on ``stack`` together: a Ctrl-C meanwhile is raised after.
        with interrupts_deferred():
            stack.enter_context(training_flags(fw, self.model))
            self.dropout_off = stack.enter_context(no_dropout(fw, self.model))
            # The step hook goes first, so a step is counted before its layers are recorded.
            handles = fw.hook_forward(self.model, on_root, after_root or (lambda *a, **k: None))
            stack.callback(_remove, handles)
            stack.enter_context(self.recorder)
            stack.callback(self.recorder.remove)  # again: a Ctrl-C handled as its ``__exit__`` began
            stack.callback(self.recorder.remove_tensor_hooks)
            if self.recorder.backward:
                grad_handles: list[Handle] = []
                stack.callback(_remove, grad_handles)
                grad_handles += [fw.hook_tensor(p, self.grad_hook(p)) for p in self.params]

    def begin_step(self) -> None:
        self.weights.append(self.weights_now())
        self.outside.append(self._written_since())
        self.states.append(self.state_now())
        self.grads.append({})
        self.steps += 1

    def end(self) -> None:
        """Keep the weights and statistics as the code left them (the end of the last step)."""
        self.weights.append(self.weights_now())
        self.outside.append(self._written_since())
        self.states.append(self.state_now())

    def stepped(self, param_ids: set[int]) -> None:
        """An optimizer holding these parameters has just stepped: what it left, to tell a later write."""
        for p in self.params:
            if id(p) in param_ids:
                self._stepped[id(p)] = _fingerprint(self.fw.to_numpy(p))

    def distributed_grads(self, param_ids: set[int]) -> None:
        """An optimizer holding these parameters is about to step: the distributed gradients it will
        apply of parameters no hook saw this step. FSDP runs its forward on tensors of its own and
        sets the parameters' reduced, sharded gradients after the backward."""
        if not self.steps or self.recorder.paused:
            return
        into = self.grads[self.steps - 1]
        for p in self.params:
            if id(p) in param_ids and id(p) not in into and (g := self.fw.grad_of(p)) is not None:
                if self.fw.layout_of(g):
                    into[id(p)] = self.recorder.hold(self.fw.to_numpy(g))

    def _written_since(self) -> dict[int, float]:
        """The parameters changed since an optimizer stepped them (read at a step boundary)."""
        now, out = self.weights[-1], {}
        for i, (checksum, norm) in self._stepped.items():
            if i in now and (written := _fingerprint(now[i]))[0] != checksum:
                out[i] = written[1] / norm if norm > 0 else float("inf")
        self._stepped = {}
        return out

    def state_now(self) -> Weights:
        """Copies of the non-trainable tensors now: a train-mode step moves running statistics."""
        out = {}
        for t in self._state_tensors:
            value = self.fw.to_numpy(t)
            if value.size:  # paddle RNN's dropout state reads as (0,)
                out[id(t)] = value.copy()
        return out

    def weights_now(self, held: bool = True) -> Weights:
        """Copies of the trainable tensors now; ``held=False``: plain copies, not the recording's."""
        if not held:
            return {id(p): np.array(self.fw.to_numpy(p), copy=True) for p in self.params}
        return {id(p): self.recorder.spool.keep(self.fw.to_numpy(p)) for p in self.params}

    def let_go(self, k: int) -> None:
        """Step ``k`` is compared: its weights and gradients are not needed again."""
        self.weights[k], self.grads[k], self.states[k], self.outside[k] = {}, {}, {}, {}

    def grad_hook(self, param: Any) -> Any:
        def hook(grad: Any) -> None:
            if self.steps and not self.recorder.paused:  # paused: nbdiff's own replays
                into, g = self.grads[self.steps - 1], self.fw.to_numpy(grad)
                # A copy: the framework reuses the buffer a hook was handed (see Recorder._grad_hook).
                prev = into.get(id(param))
                into[id(param)] = (
                    self.recorder.hold(prev + g, copy=False) if prev is not None else self.recorder.hold(g)
                )

        return hook

    def load(self, weights: Weights) -> None:
        for p in self.params:
            if id(p) in weights:
                self.fw.set_value(p, weights[id(p)])


def _fingerprint(value: np.ndarray) -> tuple[int, float]:
    """A checksum of the bytes (exact, wherever the copy lies in memory) and the norm."""
    value = np.ascontiguousarray(value)
    flat = value.ravel()
    return zlib.crc32(memoryview(value).cast("B")), float(np.sqrt(np.dot(flat, flat)))  # no float64 copy


def _remove(handles: list[Handle]) -> None:
    for h in handles:
        h.remove()
