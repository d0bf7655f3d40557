"""The settings an optimizer applies to one parameter, in one meaning for both frameworks.

Read by duck typing (torch's ``param_groups`` or paddle's private attributes), so nothing
is imported. Weight decay is described by its value for this parameter (0 when a decay
filter leaves it out) and its style: ``decoupled`` (AdamW) or ``L2`` (added to the
gradient: torch ``Adam(weight_decay=...)``, paddle ``Adam(weight_decay=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from nbdiff.align.arguments import ArgDiff
from nbdiff.trace.origin.stack import Frame, tool_roots, user_stack

__all__ = ["optimizer_settings", "optimizer_diffs", "optimizer_params", "setting_differs", "OptimizerLog"]


def _num(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def optimizer_settings(opt: Any, param: Any = None) -> dict[str, Any]:
    """``{optimizer, lr, betas, eps, momentum, weight_decay, decay style, grad_clip}`` for ``param``."""
    name = type(opt).__name__
    out: dict[str, Any] = {"optimizer": name}
    if hasattr(opt, "param_groups"):  # torch
        groups = opt.param_groups
        group = next((g for g in groups if any(p is param for p in g["params"])), groups[0] if groups else {})
        out["lr"] = _num(group.get("lr"))
        if "betas" in group:
            out["betas"] = tuple(_num(b) for b in group["betas"])
        for key in ("eps", "momentum"):
            if key in group:
                out[key] = _num(group[key])
        wd = _num(group.get("weight_decay", 0.0)) or 0.0
        decoupled = name == "AdamW" or bool(group.get("decoupled_weight_decay"))
        out["weight_decay"] = wd
        out["decay style"] = ("decoupled" if decoupled else "L2") if wd else "none"
        return out
    # paddle: a parameter group's learning rate scales the optimizer's, per parameter
    out["lr"] = _num(opt.get_lr()) * _lr_scale(param) if hasattr(opt, "get_lr") else None
    own = _paddle_setting(opt, param)
    if hasattr(opt, "_beta1"):
        out["betas"] = (_num(own("beta1", "_beta1")), _num(own("beta2", "_beta2")))
    for key, group_key, attr in (("eps", "epsilon", "_epsilon"), ("momentum", "momentum", "_momentum")):
        if hasattr(opt, attr):
            out[key] = _num(own(group_key, attr))
    if name == "AdamW":
        wd = _num(own("weight_decay", "_weight_decay")) or 0.0
        keep = getattr(opt, "_apply_decay_param_fun", None)
        if wd and keep is not None and param is not None and not keep(getattr(param, "name", "")):
            wd = 0.0  # the decay filter leaves this parameter out
        out["weight_decay"], out["decay style"] = wd, "decoupled" if wd else "none"
    else:
        reg = getattr(param, "regularizer", None) or getattr(opt, "regularization", None)
        wd = _num(getattr(reg, "_coeff", reg if isinstance(reg, (int, float)) else 0.0)) or 0.0
        out["weight_decay"], out["decay style"] = wd, "L2" if wd else "none"
    clip = getattr(opt, "_grad_clip", None)
    out["grad_clip"] = str(clip) if clip is not None else "none"
    return out


def _paddle_setting(opt: Any, param: Any) -> Callable[[str, str], Any]:
    """paddle: a setting as ``param``'s group gives it, else the optimizer's own. paddle writes each
    group's settings onto the optimizer while stepping it, so after a step its attributes hold the
    last group's (a group's AdamW ``weight_decay`` read as the whole optimizer's)."""
    groups = [g for g in getattr(opt, "_param_groups", None) or [] if isinstance(g, dict)]
    group = next((g for g in groups if any(p is param for p in g.get("params", ()))), {})
    defaults = getattr(opt, "_default_dict", None) or {}

    def own(key: str, attr: str) -> Any:
        if group.get(key) is not None:
            return group[key]
        return defaults[key] if defaults.get(key) is not None else getattr(opt, attr, None)

    return own


def _lr_scale(param: Any) -> float:
    """paddle: the factor a parameter group (or ``ParamAttr(learning_rate=...)``) puts on the learning rate."""
    scale = (getattr(param, "optimize_attr", None) or {}).get("learning_rate", 1.0)
    return float(scale) if isinstance(scale, (int, float)) else 1.0


def optimizer_params(opt: Any) -> list[Any]:
    """Every parameter an optimizer holds, through its groups (torch's, or paddle's list of dicts)."""
    if getattr(opt, "param_groups", None):
        return [p for g in opt.param_groups for p in g["params"]]
    out: list[Any] = []
    for p in getattr(opt, "_parameter_list", None) or []:
        out.extend(p["params"] if isinstance(p, dict) else [p])
    return out


def _group_lrs(opt: Any) -> Any:
    """The learning rate of each of torch's parameter groups, or paddle's one (scaled per parameter)."""
    if hasattr(opt, "param_groups"):
        return tuple(_num(g.get("lr")) for g in opt.param_groups)
    return _num(opt.get_lr()) if hasattr(opt, "get_lr") else None


def setting_differs(a: Any, b: Any) -> bool:
    """Whether two optimizers' values of one setting differ; ``None``: that optimizer has no such
    setting, as the neutral value (paddle's SGD has no momentum, torch's has momentum 0)."""
    if a is None or b is None:
        return (a if b is None else b) not in (None, 0, 0.0, "none")
    return not _same(a, b)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)
    return a == b


def optimizer_diffs(
    base_opt: Any, base_param: Any, raw_opt: Any, raw_param: Any, lrs: tuple[Any, Any] = (None, None)
) -> list[ArgDiff]:
    """Settings for this parameter that differ (the optimizer's class only when the rest cannot tell).
    ``lrs``: the learning rates at the blamed step, when known (a scheduler changes them)."""
    a, b = optimizer_settings(base_opt, base_param), optimizer_settings(raw_opt, raw_param)
    for side, lr in zip((a, b), lrs):
        if lr is not None:
            side["lr"] = lr
    out = [ArgDiff(k, a[k], b[k]) for k in a if k in b and k != "optimizer" and not _same(a[k], b[k])]
    if a.get("grad_clip", "none") != b.get("grad_clip", "none"):
        out.append(
            ArgDiff(
                "grad_clip", a.get("grad_clip", "none (clipped in the loop, if at all)"), b.get("grad_clip", "none")
            )
        )
    if not out and a["optimizer"].lower() != b["optimizer"].lower():
        out.append(ArgDiff("optimizer", a["optimizer"], b["optimizer"]))
    return out


class OptimizerLog:
    """The optimizers stepped while a comparison runs, and the learning rate of each step."""

    def __init__(self) -> None:
        self.optimizers: list[Any] = []
        self._lrs: dict[int, list[Any]] = {}
        self._stacks: dict[int, list[tuple[Frame, ...]]] = {}
        self._framework: dict[int, str] = {}

    def listen(self, stack: ExitStack, frameworks: Sequence[Any], after: Callable[[Any], None] | None = None) -> None:
        """Log every optimizer step of these frameworks until ``stack`` closes (each framework once);
        ``after(optimizer)``: once each step has run."""
        for fw in {id(f): f for f in frameworks}.values():
            stack.enter_context(fw.optimizer_steps(lambda opt, fw=fw: self.seen(opt, fw), after))

    def seen(self, opt: Any, fw: Any = None) -> None:
        if all(o is not opt for o in self.optimizers):
            self.optimizers.append(opt)
        self._lrs.setdefault(id(opt), []).append(_group_lrs(opt))
        if fw is not None:
            # The hook runs inside the user's opt.step(): the frames that show where the update happens.
            self._framework[id(opt)] = fw.name
            self._stacks.setdefault(id(opt), []).append(user_stack(fw.source_roots + tool_roots()))

    def stack_at(self, framework: str, step: int) -> tuple[Frame, ...]:
        """Where the first optimizer of ``framework`` was stepped in step ``step`` (``()``: not seen)."""
        for opt in self.optimizers:
            if self._framework.get(id(opt)) == framework:
                stacks = self._stacks.get(id(opt), [])
                return stacks[step] if 0 <= step < len(stacks) else ()
        return ()

    def lr_at(self, opt: Any, step: int, param: Any = None) -> Any:
        """The learning rate ``opt`` applied to ``param`` (its group's) at step ``step``."""
        lrs = self._lrs.get(id(opt), [])
        lr = lrs[step] if 0 <= step < len(lrs) else None
        if not isinstance(lr, tuple):
            return None if lr is None else lr * _lr_scale(param)
        groups = getattr(opt, "param_groups", [])
        at = next((i for i, g in enumerate(groups) if any(p is param for p in g["params"])), 0)
        return lr[at] if at < len(lr) else None

    def owner(self, param_ids: set[int]) -> Any:
        """The first optimizer that holds one of these parameters."""
        for opt in self.optimizers:
            if any(id(p) in param_ids for p in optimizer_params(opt)):
                return opt
        return None
