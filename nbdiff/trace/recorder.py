"""Record one model's layer calls, gradients and parameter gradients for one step.

A recorded value is the value when the event produced it: hooks copy each tensor to
the host as they see it, because a later in-place write (``out += identity``,
``ReLU(inplace=True)``) would change a kept reference. A tensor handed from one
layer to the next is copied once: copies are shared by tensor and version, and a gradient
handed on through a view by its buffer (:mod:`nbdiff.trace.recent`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nbdiff.frameworks import Framework, Handle
from nbdiff.frameworks.base import plain_attr
from nbdiff.frameworks.interrupts import done_whole, lost_interrupts_kept, raise_lost_interrupt, undone_whole
from nbdiff.trace.apis import SKIPPED_OPS, canonical_op
from nbdiff.trace.build import build_events, first_calls, step_groups
from nbdiff.trace.calls import Call, Feed, input_name
from nbdiff.trace.events import Event, TensorRecord, changed
from nbdiff.trace.nest import ONE_TENSOR_CALL, describe_non_tensors, flatten, flatten_call, unflatten
from nbdiff.trace.origin.stack import Anchor, Frame, call_stack, tool_roots, user_stack
from nbdiff.trace.recent import RecentGradients
from nbdiff.trace.spool import Spool
from nbdiff.trace.summary import keeps_values, summarized

__all__ = ["Recorder", "Feed"]


class Recorder:
    """Context manager that hooks every sublayer of ``model`` for one step.

    Hooks are removed in ``__exit__`` whatever happens.
    """

    def __init__(
        self,
        fw: Framework,
        model: Any,
        *,
        step: int = 0,
        backward: bool = True,
        feed: Feed | None = None,
        keep: Callable[[str, Any], bool] | None = None,
        stacks: bool = True,
        api_level: bool | str = False,
        api_in_library: bool = False,
        spool: Spool | None = None,
    ) -> None:
        self.fw = fw
        self.spool = spool if spool is not None else Spool(None)
        """Holds the copies: in memory, or in a file once a check has recorded enough."""
        self.model = model
        self.step = step
        self.backward = backward
        self.feed = feed
        self.keep = keep
        self.stacks = stacks
        self.calls: list[Call] = []
        self._handles: list[Handle] = []
        self._tensor_handles: list[Handle] = []
        self._active: list[Call] = []
        self._anchors: list[Anchor | None] = []
        """Beside :attr:`_active`, each running call's stack anchor (:func:`~nbdiff.trace.origin.stack.call_stack`)."""
        self._counts: dict[str, int] = {}
        self._copies: dict[tuple[int, int], tuple[Any, TensorRecord]] = {}
        """``(id, version)`` of a live tensor -> (a weak reference to it; its copy): see :meth:`_remember`."""
        self._hook_epoch = 0
        """Counts removals of the gradient hooks: a hook its handle could not reach (its tensor gone,
        the hook left in the graph) does nothing once its epoch's hooks are removed."""
        self._grad_copies: RecentGradients[np.ndarray] = RecentGradients(fw)
        self._grad_summaries: RecentGradients[TensorRecord] = RecentGradients(fw)
        self._copy_grad = lambda g: self.hold(fw.to_numpy(g))  # made once: a gradient hook's hot path
        self._backward_stack: tuple[Frame, ...] | None = None
        """User frames of the ``backward()`` call running now: walked once, shared by its layers."""
        self.hidden_roots = fw.source_roots + tool_roots()
        """Folders whose frames are not user code (empty: keep every frame)."""
        self.paused = False  # while True, calls are not recorded (a probe, a replay, the framework's own)
        self.thread: int | None = None
        """The thread whose calls are recorded (``None``: any; another's would merge into its steps)."""
        self._next_order = 0  # call numbers stay unique when finished steps are taken out
        self.steps_taken = 0
        """Root calls (steps) already handed out by :meth:`take_steps` and dropped."""
        self.api_level = bool(api_level)
        self.api_in_library = api_in_library or api_level == "all"
        """Also record the API calls inside framework layers (``api_level="all"``; else one event each)."""
        self._busy = False  # inside our own hooks: their tensor ops are not the user's API calls
        self._keeping = False  # this recorder keeps lost interrupts (lost_interrupts_kept)
        self._api_ctx: Any = None
        self._own_params: dict[int, list[tuple[str, Any]]] = {}  # by layer, as at the start (FSDP swaps its own in)
        self.roots_per_step = 1  # root calls per step: a step's micro-batches
        self.param_grads: dict[int, np.ndarray] = {}  # parameter's id -> its gradient's copy, read once
        self.on_copy: Callable[[np.ndarray], Any] | None = None  # given every host copy made (see hold)
        self.summarize = False
        """A statistics dump: activations and gradients are summarised by the framework, not copied
        (:mod:`nbdiff.trace.summary`)."""

    # -- context -------------------------------------------------------------
    def __enter__(self) -> Recorder:
        # Whole or not at all: a Ctrl-C between a hook and its kept handle left it on; it is raised after.
        done_whole(self._hook, self._unhook)
        return self

    def _hook(self) -> None:
        lost_interrupts_kept(True)
        self._keeping = True
        for path, layer in self.fw.named_layers(self.model):
            self._own_params[id(layer)] = list(self.fw.direct_params(layer))
            if self.keep is not None and not self.keep(path, layer):
                continue
            self._handles += self.fw.hook_forward(layer, self._pre(path), self._post())
        if self.api_level:
            self._api_ctx = self.fw.api_tracing(self._api)
            self._api_ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every forward hook and the API interception, whole even under Ctrl-C. Tensor hooks
        die with their graph."""
        undone_whole(self._unhook)

    def _unhook(self) -> None:
        if self._api_ctx is not None:
            ctx, self._api_ctx = self._api_ctx, None
            ctx.__exit__(None, None, None)
        if self._keeping:
            self._keeping = False
            lost_interrupts_kept(False)
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()
        self._active.clear()
        self._anchors.clear()

    def call_counts(self) -> dict[str, int]:
        """How many calls of each layer path were recorded so far."""
        return dict(self._counts)

    def remove_tensor_hooks(self) -> None:
        """Remove the gradient hooks and let go of the recorded tensors (after backward, or when
        it is skipped): their copies are what is kept. Released here, not when the recorder is
        collected: its hooks and closures form reference cycles, freed only by the cyclic
        collector, and a forward's tensors are a model's activations."""
        self.fw.remove_tensor_hooks(self._tensor_handles)
        self._tensor_handles.clear()
        self._hook_epoch += 1
        self._copies.clear()
        self._grad_copies.clear()
        self._grad_summaries.clear()

    def _elsewhere(self) -> bool:
        """Whether this call comes from a thread whose calls are not recorded."""
        return self.thread is not None and threading.get_ident() != self.thread

    # -- hooks ---------------------------------------------------------------
    def _pre(self, path: str) -> Callable[..., Any]:
        fw = self.fw

        def pre(layer: Any, args: tuple, kwargs: dict) -> Any:
            if self.paused or self._elsewhere():
                return None
            raise_lost_interrupt()
            self._busy = True
            try:
                return body(layer, args, kwargs)
            finally:
                self._busy = False

        def body(layer: Any, args: tuple, kwargs: dict) -> Any:
            call_index = self._counts.get(path, 0)
            self._counts[path] = call_index + 1
            parent = self._active[-1] if self._active else None
            if parent is None:
                self._backward_stack = None  # a new step: its backward() is still to come
            stack, anchor = (
                call_stack(self.hidden_roots, self._anchors[-1] if parent else None) if self.stacks else ((), None)
            )
            rec = Call(
                order=self._new_order(),
                path=path,
                layer=layer,
                call=call_index,
                depth=len(self._active),
                parent=parent.order if parent else None,
                stack=stack,
            )
            self.calls.append(rec)
            self._active.append(rec)
            self._anchors.append(anchor)
            leaves, template = flatten_call(args, kwargs, fw.is_tensor)
            rec.whole = self.summarize and keeps_values(fw, layer, leaves[0][1] if leaves else None)
            rec.template = template
            if template is not ONE_TENSOR_CALL:  # one tensor: no other argument to describe
                rec.args = describe_non_tensors(template)
            inplace = plain_attr(layer, "inplace", False) is True
            changed = False
            fed = self.feed.inputs.get((path, call_index)) if self.feed else None
            new_values = []
            for i, (key, t) in enumerate(leaves):
                name = input_name(key)
                value = fed[i] if fed is not None and i < len(fed) else None
                if value is not None and fw.shape_of(t) == value.shape and _stands_for(fw, t, value):
                    if fw.is_floating(t):
                        rec.given.append(self._keep(name, t))
                    base_t = fw.from_numpy(value, device=fw.device_of(t))
                    self.spool.read(value)
                    t = fw.with_value(t, base_t) if fw.requires_grad(t) else base_t
                    changed = True
                rec.inputs.append(self._keep(name, t, rec.whole))
                if self.backward and fw.requires_grad(t):
                    # A fresh autograd node per layer input gives this layer's own input gradient.
                    t = fw.identity(t, copy=inplace)
                    self._alias(t, rec.inputs[-1])
                    self._tensor_handles.append(fw.hook_tensor(t, self._grad_hook(rec, rec.grad_in, name)))
                    changed = True
                new_values.append(t)
            if changed:
                return unflatten(template, new_values)
            return None

        return pre

    def _post(self) -> Callable[..., Any]:
        fw = self.fw

        def post(layer: Any, args: tuple, kwargs: dict, output: Any) -> Any:
            if self.paused or not self._active or self._elsewhere():
                return None
            self._busy = True
            try:
                return body(output)
            finally:
                self._busy = False

        def body(output: Any) -> Any:
            rec = self._active.pop()
            self._anchors.pop()
            rec.done = True
            leaves, _ = flatten(output, fw.is_tensor, "out")
            grads = self.feed.grads.get((rec.path, rec.call)) if self.feed else None
            for name, t in leaves:
                rec.outputs.append(self._keep(name, t, rec.whole))
                graph = fw.requires_grad(t)
                rec.graph = rec.graph or graph
                if self.backward and graph:
                    replace = grads.get(name) if grads else None
                    self._tensor_handles.append(fw.hook_tensor(t, self._grad_hook(rec, rec.grad_out, name, replace)))
            return None

        return post

    def _api(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """One framework API call (API-level tracing), recorded under the layer whose code made it."""
        if self._busy or self.paused or not self._active or self._elsewhere():
            return
        parent = self._active[-1]
        fw = self.fw
        if not self.api_in_library and fw.is_library_layer(parent.layer):
            return
        op = name.strip("_")
        if op.endswith("_") or op in SKIPPED_OPS or canonical_op(op) in SKIPPED_OPS:
            return  # in-place updates and bookkeeping are not computations to compare
        self._busy = True
        try:
            ins, _ = flatten_call(args, kwargs, fw.is_tensor)
            outs, _ = flatten(out, fw.is_tensor, "out")
            if not ins or not any(fw.is_floating(t) for _, t in outs):
                return
            key = f"{parent.path}::{op}"
            call_index = self._counts.get(key, 0)
            self._counts[key] = call_index + 1
            rec = Call(
                order=self._new_order(), path=key, layer=None, call=call_index, depth=len(self._active),
                parent=parent.order, stack=call_stack(self.hidden_roots, self._anchors[-1])[0] if self.stacks else (), done=True,
                api=op,
            )  # fmt: skip
            rec.inputs = [self._keep(input_name(k), t) for k, t in ins]
            rec.outputs = [self._keep(k, t) for k, t in outs]
            self.calls.append(rec)
        finally:
            self._busy = False

    def _grad_hook(
        self, rec: Call, into: dict[str, TensorRecord], name: str, replace: np.ndarray | None = None
    ) -> Callable[[Any], Any]:
        fw = self.fw
        epoch = self._hook_epoch

        def hook(grad: Any) -> Any:
            if epoch != self._hook_epoch:
                return None
            if self.stacks and rec.backward_stack is None:
                # Autograd runs these hooks inside the user's backward() call: its frames say where.
                if self._backward_stack is None:
                    self._backward_stack = user_stack(self.hidden_roots)
                rec.backward_stack = self._backward_stack
            if replace is not None and tuple(replace.shape) == fw.shape_of(grad):
                fed = replace.astype(fw.to_numpy(grad).dtype, copy=False)
                into[name] = TensorRecord(name, fw.shape_of(grad), fw.dtype_name(grad), fed, None, fw.layout_of(grad))
                return fw.from_numpy(fed, device=fw.device_of(grad))
            if self.summarize and fw.whole_gradients and not rec.whole and (s := self._summarized_grad(name, grad)):
                into[name] = s
                return None
            # paddle calls a tensor's hook once per incoming contribution, torch once with the
            # sum: adding up gives the full gradient in both.
            prev = into.get(name)
            g = self.hold(prev.value + fw.to_numpy(grad), copy=False) if prev else self._grad_copy(grad)
            into[name] = TensorRecord(name, fw.shape_of(grad), fw.dtype_name(grad), g, None, fw.layout_of(grad))
            return None

        return hook

    def _keep(self, name: str, t: Any, whole: bool = False) -> TensorRecord:
        """The tensor's value now, as a host copy no later in-place write can change (or, where
        :attr:`summarize` and not ``whole``, its statistics and sample)."""
        fw = self.fw
        key = (id(t), fw.tensor_version(t))
        hit = self._copies.get(key)
        record = hit[1] if hit is not None and (hit[0]() if isinstance(hit[0], weakref.ref) else hit[0]) is t else None
        if record is None or (whole and record.value is None):  # a summary will not do for a whole call
            record = summarized(fw, name, t) if self.summarize and not whole else None
            if record is None:
                value = self.hold(fw.to_numpy(t))
                record = TensorRecord(name, fw.shape_of(t), fw.dtype_name(t), value, None, fw.layout_of(t))
            self._remember(t, key, record)
        return record if record.name == name else changed(record, name=name)

    def hold(self, a: np.ndarray, copy: bool = True) -> np.ndarray:
        """The array a record keeps: a copy of ``a`` (``copy=False``: ``a`` itself, a sum only the
        caller holds), held by the spool, and shown to :attr:`on_copy` (a dump's writer thread
        starts its statistics while the step still runs)."""
        value = self.spool.keep(a) if copy else self.spool.adopt(a)
        if self.on_copy is not None:
            self.on_copy(value)
        return value

    def _remember(self, t: Any, key: tuple[int, int], record: TensorRecord) -> None:
        """Find ``record`` for ``t`` while ``t`` lives. A weak reference: holding the tensor kept every
        output the model lets go of until the step's end (16 MiB more peak on a 16-layer MLP); a lookup
        checks the entry's tensor is still the one asked about (a dead one's id is reused). No callback
        at its death: a Ctrl-C landing in one is printed and dropped, and the user's loop ran on."""
        try:
            self._copies[key] = (weakref.ref(t), record)
        except TypeError:  # no weak references: held instead, till the step ends
            self._copies[key] = (t, record)

    def _grad_copy(self, grad: Any) -> np.ndarray:
        """A held copy of a gradient a hook was handed, shared with the same buffer handed again."""
        value = self._grad_copies.made(grad, self._copy_grad)
        assert value is not None
        return value

    def _summarized_grad(self, name: str, grad: Any) -> TensorRecord | None:
        """A gradient's summary (shared as :meth:`_grad_copy` shares), or ``None``: copy it."""
        record = self._grad_summaries.made(grad, lambda g: summarized(self.fw, name, g))
        return record if record is None or record.name == name else changed(record, name=name)

    def _alias(self, t: Any, record: TensorRecord) -> None:
        """``t`` holds the values ``record`` copied (a view made here): the sublayers it is
        passed to find the copy instead of making another one."""
        self._remember(t, (id(t), self.fw.tensor_version(t)), record)

    # -- results -------------------------------------------------------------
    def events(self, loss: Any | None = None) -> tuple[list[Event], list[Event], list[str]]:
        """Forward and backward events of the step, plus warnings (:func:`build_events`)."""
        return build_events(self.fw, self.calls, self.step, loss, self._live_grad, self.backward)

    def _new_order(self) -> int:
        self._next_order += 1
        return self._next_order - 1

    def settled(self) -> bool:
        """Whether no held step's graph may still be backpropagated: each root call made none (no
        output needs a gradient), or a backward has reached its outputs."""
        # The first unsettled root ends it: a loop that never backpropagates costs one look per step.
        return all(not rec.graph or rec.grad_out for rec in self.calls if rec.depth == 0)

    def take_steps(
        self, grads: list[dict[int, np.ndarray]], keep: int = 0
    ) -> list[tuple[list[Event], list[Event], list[str]]]:
        """Events of every step recorded so far but the last ``keep``, then forget them, so a long
        recording holds a step or two at a time (call it between steps, once every step held is
        :meth:`settled`: the gradient hooks all go). Steps keep their absolute numbers."""
        groups = step_groups(self.calls, self.roots_per_step)
        done = groups[: len(groups) - keep] if keep else groups
        if not done:
            return []
        out = self.events_by_root_call(grads, groups=done)
        dropped = {id(rec) for group in done for rec in group}
        self.calls = [rec for rec in self.calls if id(rec) not in dropped]
        # The steps' backward has run: their gradient hooks hold activations (paddle keeps what a
        # hooked tensor's graph needs), so a long recording grew by every step's tensors.
        self.remove_tensor_hooks()
        self.steps_taken += len(done)
        return out

    def events_by_root_call(
        self, grads: list[dict[int, np.ndarray]], groups: list[list[Call]] | None = None
    ) -> list[tuple[list[Event], list[Event], list[str]]]:
        """One step per call of the root model (a training loop's iterations), with the
        parameter gradients of step ``k`` taken from ``grads[k]`` (by ``id`` of the parameter)."""
        groups = step_groups(self.calls, self.roots_per_step) if groups is None else groups
        return [self._step(group, self.steps_taken + i, grads) for i, group in enumerate(groups)]

    def step_events(self, k: int, grads: list[dict[int, np.ndarray]]) -> tuple[list[Event], list[Event], list[str]]:
        """The events of step ``k`` alone (a step still held, not yet taken)."""
        return self._step(step_groups(self.calls, self.roots_per_step)[k - self.steps_taken], k, grads)

    def _step(
        self, group: list[Call], k: int, grads: list[dict[int, np.ndarray]]
    ) -> tuple[list[Event], list[Event], list[str]]:
        got: dict[int, np.ndarray] = grads[k] if k < len(grads) else {}
        return build_events(
            self.fw, group, k, None, lambda p: got.get(id(p)), self.backward, self._params_of, first_calls(group)
        )

    def _params_of(self, layer: Any) -> list[tuple[str, Any]]:
        return self._own_params.get(id(layer)) or self.fw.direct_params(layer)

    def _live_grad(self, param: Any) -> np.ndarray | None:
        g = self.fw.grad_of(param)
        if g is None:
            return None
        # A copy: clearing gradients zeroes paddle's in place. Kept by id for the comparison.
        self.param_grads[id(param)] = value = self.hold(self.fw.to_numpy(g))
        return value


def _stands_for(fw: Framework, t: Any, value: np.ndarray) -> bool:
    """Whether base's ``value`` can be fed for raw's ``t``: of one kind (floats, booleans, integers).
    A mask of True/False is not one of 0/-inf, though of one shape: fed, paddle refused to add it
    and torch added True as 1."""
    kind = value.dtype.kind
    if fw.is_floating(t):
        return kind in "fc"
    return kind not in "fc" and (kind == "b") == (fw.dtype_name(t) == "bool")
