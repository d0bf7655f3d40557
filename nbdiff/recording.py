"""``record``: dump one model's steps while the user's own code runs it, for a later ``compare``.

Each side is recorded where it runs (its own process, machine, accelerator or rank)
and compared later with :func:`nbdiff.compare` or ``nbdiff compare A B``. Options
follow TroubleShooter's ``api_dump_start`` (modes ``all``/``list``/``range``/``api_list``
with ``scope``; ``filter_data``; ``filter_stack``) with nbdiff's dump types.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nbdiff.align.arguments import layer_arguments, recorded_arguments
from nbdiff.align.fused import layout_facts
from nbdiff.align.optimizer_settings import optimizer_params
from nbdiff.engine.gc_pause import gc_frozen
from nbdiff.engine.options import check_recordable
from nbdiff.errors import OptionError
from nbdiff.frameworks import Framework, framework_of
from nbdiff.frameworks.interrupts import interrupts_deferred, undone_whole
from nbdiff.trace.capture import BATCH_NORMS, Capture
from nbdiff.trace.dump.store import DUMP_TYPES
from nbdiff.trace.dump.writer import DumpWriter
from nbdiff.trace.events import Event, Kind, Phase, changed
from nbdiff.trace.mesh import JobLayout
from nbdiff.trace.origin.constructors import NotRebuildable, constructor_of
from nbdiff.trace.param_events import states, updates, weights_at_start, with_uncalled_grads
from nbdiff.trace.session import ModelSession
from nbdiff.weights.plan import all_class_names

__all__ = ["record", "MODES", "event_names"]

MODES = ("all", "list", "range", "api_list")


class record:
    """``with nbdiff.record(model, dump_dir): <your training code>``.

    Every call of ``model`` starts a step. Written to ``dump_dir/rank{R}/`` step by step, by a
    writer thread while the next step runs, or as the step ends where the framework's threads take
    every core (a crash loses at most the step in progress and the one being written; a step the
    code raised in is marked cut short), one folder per distributed rank. ``dump_type``:
    ``tensor`` (statistics and every tensor), ``statistics`` (no payload) or ``stack`` (events and
    stacks only). A folder that already holds a dump is refused unless ``overwrite=True``.

    For big models (:mod:`nbdiff.trace.capture`): ``layers`` (path patterns) and ``depth`` keep
    some layers' calls, ``steps`` some steps (the first N, a list or range, or a function of the
    step index), ``tensors`` the values of some layers only (the rest as statistics), for example
    ``tensors=result.blamed_paths("raw"), steps=[result.first_divergence.step]`` after a first
    comparison of statistics dumps. Both sides must be recorded with the same selection.

    Distributed jobs: every rank records its own folder. A job on several mesh dimensions says its
    mesh, ``mesh=`` torch's ``DeviceMesh`` (found on the parameters where ``fully_shard`` or
    ``parallelize_module`` put it) or ``{"dp": 2, "tp": 2}`` (ranks row-major, as fleet lays them),
    and ``compare`` gathers each tensor over it. ``data_parallel`` names the dimensions the batch is
    split along (default: those named like ``dp``, ``fsdp``, ``data``), ``dp_reduce`` how their
    gradients are reduced (``mean``, DDP's and FSDP's, or ``sum``). ``micro_batches=M``: a step is
    ``M`` calls of the model (gradient accumulation, a pipeline schedule's micro-batches), which
    ``compare`` joins into one call on the whole batch; ``micro_batch_reduce``: ``mean`` where each
    micro-batch backpropagates its own mean loss (torch's pipeline schedules, which scale the
    gradients after), ``sum`` where the losses add up to the step's (a loop dividing each by ``M``).
    Pipeline stages are a mesh dimension named ``pp`` (``mesh={"pp": 2}``), whose ranks' layers
    ``compare`` joins into one model.
    """

    def __init__(
        self,
        model: Any,
        dump_dir: str | os.PathLike[str],
        *,
        api_level: bool | str = False,
        dump_type: str = "tensor",
        mode: str = "all",
        scope: list[str] | None = None,
        filter_data: bool = True,
        filter_stack: bool = True,
        retain_backward: bool = True,
        overwrite: bool = False,
        layers: Sequence[str] | str | None = None,
        depth: int | None = None,
        steps: int | Iterable[int] | Callable[[int], bool] | None = None,
        tensors: Sequence[str] | str | None = None,
        mesh: Any = None,
        data_parallel: str | Sequence[str] | None = None,
        dp_reduce: str = "mean",
        micro_batches: int = 1,
        micro_batch_reduce: str = "mean",
    ) -> None:
        if dump_type not in DUMP_TYPES:
            raise OptionError(f"dump_type={dump_type!r} is not one of {DUMP_TYPES}.")
        if mode not in MODES:
            raise OptionError(f"mode={mode!r} is not one of {MODES}.")
        if mode != "all" and not scope:
            raise OptionError(f"mode={mode!r} needs scope=[...] (event names, dotted layer paths or keywords).")
        if mode == "range" and len(scope or ()) != 2:
            raise OptionError(f"mode='range' takes scope=[first, last]; got {scope!r}.")
        self.capture = Capture.of(layers, depth, steps, tensors)
        self.fw: Framework = framework_of(model, "model")
        check_recordable((self.fw,), (model,), ("the model",))
        self.model = model
        self.dump_dir = Path(dump_dir)
        self._layout = JobLayout(mesh, data_parallel, dp_reduce, micro_batches, micro_batch_reduce)
        self.options = dict(
            dump_type=dump_type, mode=mode, scope=list(scope or []), filter_data=filter_data,
            filter_stack=filter_stack, retain_backward=retain_backward, micro_batches=micro_batches,
            micro_batch_reduce=micro_batch_reduce,
        )  # fmt: skip
        self._session = ModelSession(self.fw, model, "model", backward=retain_backward, api_level=api_level)
        self.api_level = api_level
        if not filter_stack:
            self._session.recorder.hidden_roots = ()
        self._stack = ExitStack()
        self.overwrite = overwrite
        self.path: Path | None = None
        """The rank folder written, once the block has ended."""

    def __enter__(self) -> record:
        dist = self.fw.distributed_rank()
        rank, world = dist if dist is not None else _env_rank()
        meta = dict(
            framework=self.fw.name, framework_version=str(self.fw.version), model=type(self.model).__name__,
            rank=rank, world_size=world, api_level=self.api_level, **{k: v for k, v in self.options.items() if k != "dump_type"},
            capture=self.capture.described or {},
        )  # fmt: skip
        if (mesh := self._layout.mesh(self.fw, self.model, rank, world)) is not None:
            meta["mesh"] = mesh.to_json()
        self._layers = dict(self.fw.named_layers(self.model))
        # Each layer's own parameters, read once: every step's updates and gradients look them up.
        self._params = {path: dict(self.fw.direct_params(layer)) for path, layer in self._layers.items()}
        layers = {path: all_class_names(layer) for path, layer in self._layers.items()}
        # What pairing reads of a live layer (head counts, an activation applied inside), for compare.
        facts = {path: f for path, layer in self._layers.items() if (f := layout_facts(layer))}
        meta["layer_facts"] = facts
        # Each layer's constructor arguments (eps, momentum, padding...): why() offline, as live.
        args = {
            path: a
            for path, layer in self._layers.items()
            if (a := recorded_arguments(layer_arguments(self.fw.name, layer)))
        }
        meta["layer_args"] = args
        # How each layer was built (class and literal arguments): compare rebuilds a blamed one with its
        # recorded weights and measures its local error (engine/rebuilt).
        meta["layer_init"] = _constructors(self.fw, self._layers)
        # A BatchNorm's mode when the recording began: compare recomputes it as it ran (engine/recomputed).
        meta["batch_norm_training"] = {
            path: bool(self.fw.is_training(layer))
            for path, layer in self._layers.items()
            if type(layer).__name__ in BATCH_NORMS
        }
        # A tensor-parallel model's parameters, as spread over the ranks: compare gathers its shards.
        meta["param_layouts"] = {
            path: lay
            for path, own in self._params.items()
            if (lay := {n: s for n, p in own.items() if (s := self.fw.layout_of(p))})
        }
        # Where the framework's threads take every core, a writer thread beside them only competes for
        # one: the torch CNN's statistics dump, default threads, took 2.31-2.38x its bare step written
        # in the training thread against 2.76-2.81x by a writer thread (tensor dumps: alike).
        first = next((p for own in self._params.values() for p in own.values()), None)
        background = first is None or not self.fw.cores_taken(first)
        self._writer: DumpWriter | None = None
        try:
            # A Ctrl-C once the writer's thread runs and its lock is taken must reach the except below
            # with the writer in hand (it left the thread running and the folder locked).
            dump_type, folder = str(self.options["dump_type"]), self.dump_dir / f"rank{rank}"
            with interrupts_deferred():
                self._writer = DumpWriter(folder, meta, layers, dump_type, self.overwrite, background)
            self._start_recording(background)
        except BaseException:
            self._stack.close()
            if self._writer is not None:
                self._writer.abandon()
            raise
        return self

    def _start_recording(self, background: bool) -> None:
        """The hooks and listeners of a recording whose writer is made (``background``: it writes in its thread)."""
        assert self._writer is not None
        if self.capture.tensors is not None:
            self._writer.keeps_values = self.capture.keeps_values
        # The steps are the calls made by the thread that records; others' would be merged into them.
        self._thread, self._other_threads, self._root_calls, self._probing = threading.get_ident(), 0, 0, False
        self._session.recorder.thread = self._thread
        self._session.recorder.roots_per_step = int(self.options["micro_batches"])
        self._session.recorder.summarize = self.options["dump_type"] == "statistics"
        if background and self.options["mode"] == "all" and not self.capture.narrows:
            # The writer thread works on each array as it is copied; where events are left out, most
            # of that would be wasted.
            self._session.recorder.on_copy = self._writer.prepare
        self._session.install(self._stack, self._on_step, self._after_root)
        # What each optimizer step left: a parameter written after it is the user's write, kept apart.
        session = self._session
        stepped = lambda opt: session.stepped({id(p) for p in optimizer_params(opt)})  # noqa: E731
        applied = lambda opt: session.distributed_grads({id(p) for p in optimizer_params(opt)})  # noqa: E731
        self._stack.enter_context(self.fw.optimizer_steps(applied, stepped))
        # What lives now is out of the collector's passes while the loop records (engine/gc_pause).
        self._stack.enter_context(gc_frozen())

    def _on_step(self, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() != self._thread:  # another thread's call: not this recording's step
            self._other_threads += 1
            return
        if self.fw.framework_probe():  # not the user's call: neither a step nor recorded
            self._session.recorder.paused = self._probing = True
            return
        self._root_calls += 1
        if (self._root_calls - 1) % int(self.options["micro_batches"]):  # a micro-batch within the step
            return
        self._session.begin_step()
        # The previous step is complete (this hook runs before the new root call is recorded):
        # write it and let it go.
        self._flush()

    def _after_root(self, *args: Any, **kwargs: Any) -> None:
        if self._probing:
            self._session.recorder.paused = self._probing = False

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Hooks off, modes back, the last steps written and the dump closed: whole, even under Ctrl-C.
        undone_whole(lambda: self._close(exc_type is not None))
        if self._other_threads:
            warnings.warn(
                f"nbdiff.record: {self._other_threads} call(s) of the model from threads other than the one "
                f"recording were not recorded ({self.path}); record each thread's model on its own.",
                stacklevel=2,
            )
        if self._session.dropout_off:
            warnings.warn(
                f"nbdiff.record: dropout was off while recording ({', '.join(self._session.dropout_off[:6])}), so "
                "that the other side's recording can agree; the steps recorded are not the ones your loop makes "
                "without nbdiff. The rates are back as they were.",
                stacklevel=2,
            )

    def _close(self, raised: bool) -> None:
        """Hooks off and modes back, then the last steps written and the dump closed (``raised``: the
        user's code raised; the step running then is kept, marked as cut short, never read as agreement)."""
        try:
            self._session.end()
        finally:
            self._stack.close()
        written, flushed = 0, False
        try:
            written = self._flush()
            flushed = True
        finally:
            if self._other_threads:
                self._writer.meta["calls_from_other_threads"] = self._other_threads
            if self._session.dropout_off:
                self._writer.meta["dropout_off"] = list(self._session.dropout_off)
            self.path = self._writer.close(interrupted=(raised and written > 0) or not flushed)

    def _flush(self) -> int:
        """Write the steps recorded since the last flush; returns how many."""
        session = self._session
        first = session.recorder.steps_taken
        n = 0
        for i, (forward, backward, _) in enumerate(session.recorder.take_steps(session.grads)):
            k = first + i
            moved = updates(
                self.fw,
                self._layers,
                self._params,
                k,
                (session.weights[k], session.weights[k + 1]),
                session.outside[k + 1],
            )
            moved += states(self.fw, self._layers, k, session.states[k], session.states[k + 1])
            backward = with_uncalled_grads(self.fw, self._params, forward, backward, session.grads[k])
            if self.capture.keeps_step(k):
                # The weights once per run of recorded steps; compare adds the updates up to later ones.
                # (a statistics dump keeps their statistics: the magnitude an update's tolerance allows for)
                starts = k == 0 or not self.capture.keeps_step(k - 1)
                weights = weights_at_start(self.fw, self._layers, self._params, k, session.weights[k]) if starts else []
                weights = [e for e in weights if self.capture.keeps_values(e)]
                self._writer.add_step(self._select(forward + backward + moved + weights))
            session.let_go(k)  # done with them
            n += 1
        return n

    def _select(self, events: list[Event]) -> list[Event]:
        names = event_names(events)
        scope = self.options["scope"]
        keep = _selector(str(self.options["mode"]), list(scope) if isinstance(scope, list) else [], events, names)
        depth = {e.path: e.depth for e in events if e.kind is Kind.LAYER}  # an update's is its layer's call's
        out = [e for e in events if keep(e) and self.capture.keeps(e, depth.get(e.path))]
        if self.options["filter_data"]:
            out = [_floating_only(e) for e in out]
        return out


def event_names(events: list[Event]) -> dict[tuple[str, str, int], str]:
    """TroubleShooter-style names (``NN_Linear_0``): class name and its running count in the step."""
    names: dict[tuple[str, str, int], str] = {}
    counts: dict[str, int] = {}
    for e in events:
        if e.phase is not Phase.FORWARD:
            continue
        key = (e.kind.value, e.path, e.call)
        if key not in names:
            n = counts.get(e.type_name, 0)
            counts[e.type_name] = n + 1
            names[key] = f"NN_{e.type_name}_{n}"
    return names


def _selector(mode: str, scope: list[str], events: list[Event], names: dict[tuple[str, str, int], str]) -> Any:
    def ids(e: Event) -> set[str]:
        key = (Kind.LAYER.value if e.kind is Kind.PARAM else e.kind.value, e.path, e.call)
        out = {e.path, f"{e.path}#{e.call}"}
        if key in names:
            out.add(names[key])
        return out

    if mode == "all":
        return lambda e: True
    if mode == "list":
        wanted = set(scope)
        return lambda e: bool(ids(e) & wanted)
    if mode == "api_list":
        words = [w.lower() for w in scope]
        return lambda e: any(w in x.lower() for x in ids(e) | {e.type_name} for w in words)
    # range: forward events from the first name to the last, inclusive, and their backward/updates
    forward = [e for e in events if e.phase is Phase.FORWARD]
    start = next((i for i, e in enumerate(forward) if scope[0] in ids(e)), None)
    end = next((i for i, e in enumerate(forward) if scope[1] in ids(e)), None)
    if start is None or end is None:
        missing = scope[0] if start is None else scope[1]
        raise OptionError(f"mode='range': {missing!r} names no event of the step; names look like "
                          f"{sorted(names.values())[:4]} or dotted layer paths.")  # fmt: skip
    inside = {(e.path, e.call) for e in forward[start : end + 1]}
    return lambda e: (e.path, e.call) in inside


def _floating_only(e: Event) -> Event:
    if all(t.floating for ts in (e.inputs, e.outputs, e.params) for t in ts):
        return e
    keep = lambda ts: tuple(t for t in ts if t.floating)  # noqa: E731
    return changed(e, inputs=keep(e.inputs), outputs=keep(e.outputs), params=keep(e.params))


def _constructors(fw: Framework, layers: dict[str, Any]) -> dict[str, Any]:
    """``{path: {"class": "module:qualname", "kwargs": {...}}}`` of the layers whose constructor
    arguments are kept on them as literals."""
    out = {}
    for path, layer in layers.items():
        try:
            out[path] = constructor_of(fw, layer).to_json()
        except NotRebuildable:
            continue
    return out


def _env_rank() -> tuple[int, int]:
    for rank, world in (("RANK", "WORLD_SIZE"), ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ.get(world, "1"))
    return 0, 1
