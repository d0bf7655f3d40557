"""A Ctrl-C at every event boundary of auto_diff, watch and record leaves nothing of nbdiff's behind.

A trap placed in the user's models raises ``KeyboardInterrupt`` at the Nth layer call (forward) or
the Nth gradient through it (backward), for every N until a run completes without reaching it.
After each interrupt: no forward hook, no tensor hook, no API patch (torch function modes,
paddle's API table) of nbdiff's is left, train/eval modes, dropout rates, ``requires_grad`` and
weights are as the user had them, the Ctrl-C handler is Python's, and memory is back within a
bound of where it started.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import nbdiff
from nbdiff.frameworks.patching import active_patches

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

X = np.random.RandomState(0).randn(4, 16).astype("float32")


class _Trap:
    """Counts the boundaries the user's models pass; at the ``at``-th, raises ``KeyboardInterrupt``
    or sends the process a real SIGINT (``signal``), which Python raises at its next chance: inside
    nbdiff's own code as often as not."""

    def __init__(self) -> None:
        self.at, self.seen, self.signal = -1, 0, False

    def tick(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            if self.signal:
                os.kill(os.getpid(), signal.SIGINT)
            else:
                raise KeyboardInterrupt


TRAP = _Trap()


def _ticked(g: Any) -> Any:
    TRAP.tick()
    return g


def _model(fw: str, bug: bool = False) -> Any:
    """Layers with a trap between them; ``bug``: the second trap scales by 1.01 (auto_diff then
    replays layers, more boundaries of nbdiff's own)."""
    from tests.structure_models import backward_function

    nn, trap_fn = (torch.nn if fw == "torch" else paddle.nn), backward_function(fw, _ticked)

    class Trap(nn.Module if fw == "torch" else nn.Layer):
        def __init__(self, s: float = 1.0) -> None:
            super().__init__()
            self.s = s

        def forward(self, x):
            TRAP.tick()
            return trap_fn.apply(x) * self.s

    torch.manual_seed(0)
    paddle.seed(0)
    layers = [nn.Linear(16, 32), Trap(), nn.Dropout(0.2), nn.GELU(), Trap(1.01 if bug else 1.0), nn.Linear(32, 4)]
    return nn.Sequential(*layers)


def _tensor(model: Any, a: np.ndarray) -> Any:
    return torch.from_numpy(a) if isinstance(model, torch.nn.Module) else paddle.to_tensor(a)


def _layers(model: Any) -> list[Any]:
    return list(model.modules()) if isinstance(model, torch.nn.Module) else list(model.sublayers(include_self=True))


def _state(models: tuple[Any, ...]) -> dict[str, Any]:
    """Everything of the models and the process that nbdiff touches and must put back."""
    out: dict[str, Any] = {
        "patches": active_patches(),
        "torch modes": torch._C._len_torch_function_stack(),
        "paddle api": (paddle.matmul, paddle.Tensor.__add__, paddle.nn.functional.gelu, paddle.add),
        "sigint": signal.getsignal(signal.SIGINT),
        "unraisable hook": sys.unraisablehook,
        "grad modes": (torch.is_grad_enabled(), paddle.is_grad_enabled()),
        "collector": (gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()),
        "nbdiff threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("nbdiff")),
    }
    for i, m in enumerate(models):
        layers = _layers(m)
        if isinstance(m, torch.nn.Module):
            hooks = [len(x._forward_hooks) + len(x._forward_pre_hooks) + len(x._backward_hooks) for x in layers]
            params = list(m.parameters())
            out[f"{i} tensor hooks"] = [len(p._backward_hooks or {}) for p in params]
            out[f"{i} grad flags"] = [p.requires_grad for p in params]
            out[f"{i} weights"] = [p.detach().numpy().tobytes() for p in params]
        else:
            hooks = [len(x._forward_pre_hooks) + len(x._forward_post_hooks) for x in layers]
            params = m.parameters()
            out[f"{i} grad flags"] = [p.stop_gradient for p in params]
            out[f"{i} weights"] = [p.numpy().tobytes() for p in params]
        out[f"{i} hooks"] = hooks
        out[f"{i} modes"] = [x.training for x in layers]
        out[f"{i} dropout"] = [getattr(x, "p", None) for x in layers]
    return out


def _anon_mib() -> float:
    gc.collect()
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def _auto_diff(base: Any, raw: Any, api: bool) -> None:
    nbdiff.auto_diff(base, raw, X, api_level=api)


def _watch(base: Any, raw: Any, api: bool) -> None:
    with nbdiff.watch(base, raw, auto_init=False, api_level=api):
        for _ in range(2):
            base(_tensor(base, X)).mean().backward()
            raw(_tensor(raw, X)).mean().backward()


def _record(base: Any, raw: Any, api: bool, folder: Any = None) -> None:
    with nbdiff.record(raw, folder, api_level=api, overwrite=True):
        for _ in range(2):
            raw(_tensor(raw, X)).mean().backward()


def _clear_grads(models: tuple[Any, ...]) -> None:
    for m in models:
        if isinstance(m, torch.nn.Module):
            m.zero_grad(set_to_none=True)
        else:
            m.clear_gradients()


VERBS: dict[str, Callable[..., None]] = {"auto_diff": _auto_diff, "watch": _watch, "record": _record}


def _run_of(verb: str, models: tuple[Any, ...], folder: Any, api: bool = False) -> Callable[[], None]:
    """One run of ``verb`` over the models (``record`` writes into ``folder``)."""
    if verb == "record":
        return lambda: _record(*models, api, folder / "dump")
    return lambda: VERBS[verb](*models, api)


def _each_point_leaves_nothing(
    verb: str, run: Callable[[], None], models: tuple[Any, ...], trap: Any, what: str, after_each: Any = None
) -> int:
    """``run()`` with ``trap`` raising a Ctrl-C at its point 1, 2, ... (``trap.at``; ``trap.seen``: points
    passed) until a run ends without reaching its point; after each, nothing of nbdiff's is left
    (``after_each()`` is called then). Returns how many runs were interrupted."""
    before = _state(models)
    interrupted = 0
    for n in range(1, 400):
        trap.at, trap.seen = n, 0
        try:
            run()
        except KeyboardInterrupt:
            interrupted += 1
        except OSError as exc:  # paddle's wrapping of a Ctrl-C in the user's own backward() call
            assert verb != "auto_diff" and "KeyboardInterrupt" in str(exc), exc
            interrupted += 1
        else:
            break  # the run never reached point n: every one was tried
        finally:
            trap.at = -1
            _clear_grads(models)
        if trap.seen < n:
            break  # the run ended before point n: every one was tried
        after = _state(models)
        diff = [k for k in before if before[k] != after[k]]
        assert not diff, f"{verb} interrupted at {what} {n}: changed {diff}"
        if after_each is not None:
            after_each()
    return interrupted


@pytest.mark.parametrize("how", ["raised", "sigint"])
@pytest.mark.parametrize("bug", [False, True], ids=["equivalent", "bug"])
@pytest.mark.parametrize("api", [False, True], ids=["layers", "api"])
@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_ctrl_c_at_every_event_boundary_leaves_nothing_behind(verb, direction, api, bug, how, tmp_path):
    bfw, rfw = direction.split("->")
    TRAP.signal = how == "sigint"
    models = (_model(bfw), _model(rfw, bug))
    for m in models:
        m.train()
    start: list[float] = []  # memory after the first interrupt
    run = _run_of(verb, models, tmp_path, api)
    interrupted = _each_point_leaves_nothing(
        verb, run, models, TRAP, "boundary", lambda: start or start.append(_anon_mib())
    )
    assert interrupted >= 8, f"only {interrupted} boundaries reached"
    assert _anon_mib() - start[0] < 150, "memory grew with the interrupts"
    TRAP.signal = False
    COUNTS[(verb, direction, api, bug, how)] = interrupted


def _interrupted_at_random(run: Callable[[], None], delay: float) -> bool:
    """``run()`` with a real SIGINT sent to the process after ``delay`` seconds, from another thread, as a
    user's Ctrl-C comes: between any two of nbdiff's statements. Whether it interrupted the run; the
    signal has landed either way when this returns."""
    fired = threading.Event()

    def fire() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        fired.set()

    timer = threading.Timer(delay, fire)
    interrupted = False
    try:
        try:
            timer.start()
            run()
        except KeyboardInterrupt:
            interrupted = True
        except OSError as exc:  # paddle's wrapping of a Ctrl-C in the user's own backward() call
            if "KeyboardInterrupt" not in str(exc):
                raise
            interrupted = True
        # Not yet fired (the run was faster): wait, so the signal lands here and not in the checks.
        fired.wait(10)
        time.sleep(0.02)
    except KeyboardInterrupt:
        pass
    timer.join()
    return interrupted


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_real_ctrl_cs_at_random_times_leave_nothing_behind(verb, direction, tmp_path):
    # A real SIGINT lands between any two of nbdiff's statements, not only where the model's code
    # runs: 3 of 25 such trials left auto_diff's forward hooks on every layer of raw and its
    # unraisable hook set. TRIALS per case (NBDIFF_SIGINT_TRIALS=500 for a long campaign).
    bfw, rfw = direction.split("->")
    models = (_model(bfw), _model(rfw, True))
    for m in models:
        m.train()
    run = VERBS[verb]
    go = (lambda: _record(*models, False, tmp_path / "dump")) if verb == "record" else (lambda: run(*models, False))
    go()  # a whole run first: auto_diff copies base's weights into raw, as the user asked
    _clear_grads(models)
    t0 = time.perf_counter()
    go()  # what one run takes, warm
    _clear_grads(models)
    took = time.perf_counter() - t0
    before = _state(models)
    rng = random.Random(f"{verb} {direction}")
    interrupted, trial, scale = 0, 0, 1.2
    # TRIALS trials, and more until a fifth of them were interrupted: a run timed on a loaded machine is
    # longer than the ones after it, and signals sent after a run ended test nothing (each further block
    # of TRIALS aims earlier).
    while trial < TRIALS or (interrupted < TRIALS // 5 and trial < 8 * TRIALS):
        if trial and trial % TRIALS == 0:
            scale /= 2
        delay = rng.uniform(0.0, took * scale)
        interrupted += _interrupted_at_random(go, delay)
        _clear_grads(models)
        after = _state(models)
        diff = [k for k in before if before[k] != after[k]]
        assert not diff, f"{verb}, a SIGINT {delay * 1e3:.1f} ms in (trial {trial}): changed {diff}"
        trial += 1
    assert interrupted >= TRIALS // 5, f"only {interrupted} of {trial} trials were interrupted"
    RANDOM_COUNTS[(verb, direction)] = interrupted


class _EntryTrap:
    """``interrupts_deferred`` as nbdiff's modules call it, raising ``KeyboardInterrupt`` as its ``at``-th
    use begins: a real Ctrl-C can land there, before the deferral holds SIGINT, and the block it guards
    (removing hooks, restoring the collector, undoing patches) then never ran."""

    def __init__(self, real: Callable[[], Any]) -> None:
        self.real, self.at, self.seen = real, -1, 0

    def __call__(self) -> Any:
        from nbdiff.frameworks.interrupts import _Caught

        if isinstance(signal.getsignal(signal.SIGINT), _Caught):
            return self.real()  # inside another deferral: a Ctrl-C is held there, as a real one would be
        self.seen += 1
        if self.seen == self.at:
            raise KeyboardInterrupt
        return self.real()


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_ctrl_c_as_any_deferral_begins_leaves_nothing_behind(verb, monkeypatch, tmp_path):
    import importlib

    from nbdiff.frameworks import interrupts

    real = interrupts.interrupts_deferred
    trap = _EntryTrap(real)
    users = [
        "nbdiff.frameworks.interrupts", "nbdiff.trace.session", "nbdiff.trace.recorder", "nbdiff.trace.inputs",
        "nbdiff.engine.replay", "nbdiff.engine.gc_pause", "nbdiff.watching", "nbdiff.recording",
        "nbdiff.frameworks.patching",
    ]  # fmt: skip
    for name in users:
        module = importlib.import_module(name)
        if getattr(module, "interrupts_deferred", None) is real:
            monkeypatch.setattr(module, "interrupts_deferred", trap)
    models = (_model("torch"), _model("paddle", bug=True))
    interrupted = _each_point_leaves_nothing(
        verb, _run_of(verb, models, tmp_path), models, trap, "the start of deferral"
    )
    assert interrupted >= 3, f"only {interrupted} deferrals reached"


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_ctrl_c_as_a_recorders_exit_begins_leaves_nothing_behind(verb, monkeypatch, tmp_path):
    # A real SIGINT is handled as a Python function begins: one landing as ``Recorder.__exit__`` was
    # called left auto_diff's hooks on raw and its unraisable hook set (found by the random campaign).
    from nbdiff.trace.recorder import Recorder

    real_exit = Recorder.__exit__
    trap = _EntryTrap(lambda: None)

    def exit_interrupted(self, *exc):
        trap()  # raises at its point, as a Ctrl-C handled as the exit began
        return real_exit(self, *exc)

    monkeypatch.setattr(Recorder, "__exit__", exit_interrupted)
    models = (_model("torch"), _model("paddle", bug=True))
    interrupted = _each_point_leaves_nothing(
        verb, _run_of(verb, models, tmp_path), models, trap, "the start of recorder exit"
    )
    # watch and record leave their recorders inside a deferral, where a Ctrl-C is held: none is interrupted.
    assert interrupted >= (2 if verb == "auto_diff" else 0)


TRIALS = int(os.environ.get("NBDIFF_SIGINT_TRIALS", "40"))
RANDOM_COUNTS: dict[tuple[str, str], int] = {}
"""Trials a random SIGINT interrupted, per case (printed by ``-s`` for the closing note)."""

COUNTS: dict[tuple[str, str, bool, bool, str], int] = {}
"""Interrupt points tried per case (printed by ``-s`` for the closing note)."""


def teardown_module() -> None:
    if COUNTS:
        print(f"\nchaos: {sum(COUNTS.values())} interrupt points over {len(COUNTS)} cases: {COUNTS}")
    if RANDOM_COUNTS:
        print(f"\nrandom SIGINTs: {TRIALS} trials a case, interrupted: {RANDOM_COUNTS}")
