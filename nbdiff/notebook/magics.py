"""``%modeldiff`` (line) and ``%%modeldiff`` (cell): auto_diff from the notebook, shown as the view.

Line: ``%modeldiff BASE RAW INPUTS [flags]`` runs :func:`nbdiff.auto_diff` on the named
variables. Cell: ``%%modeldiff BASE RAW [flags]`` records both models while the cell
body runs the user's own training code (base first, then raw, every step).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, NoReturn

from IPython.core.magic import Magics, line_cell_magic, magics_class

from nbdiff.errors import NbdiffError, OptionError

__all__ = ["ModelDiffMagics", "USAGE", "parse_flags"]

USAGE = (
    "usage: %modeldiff BASE RAW INPUTS [--single-step] [--steps N] [--atol X] [--rtol X] "
    "[--mode strict|mean|abs_mean] [--phase both|forward|backward] [--loss A B] [--opt A B] "
    "[--no-init] [--api] [--out NAME]\n"
    "       %%modeldiff BASE RAW [same flags, without INPUTS]"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit the kernel's process
        raise OptionError(f"%modeldiff: {message}\n{USAGE}")


def _parser(cell: bool) -> argparse.ArgumentParser:
    p = _Parser(prog="%%modeldiff" if cell else "%modeldiff", add_help=False)
    p.add_argument("base")
    p.add_argument("raw")
    if not cell:
        p.add_argument("inputs")
    p.add_argument("--single-step", action="store_true")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--atol", type=float)
    p.add_argument("--rtol", type=float)
    p.add_argument("--mode", choices=["strict", "mean", "abs_mean"], default="strict")
    p.add_argument("--phase", choices=["both", "forward", "backward"], default="both")
    p.add_argument("--loss", nargs=2, metavar=("A", "B"))
    p.add_argument("--opt", nargs=2, metavar=("A", "B"))
    p.add_argument("--no-init", action="store_true")
    p.add_argument("--api", action="store_true", help="also trace framework API calls inside layers")
    p.add_argument("--out", default="_modeldiff")
    return p


def parse_flags(line: str, cell: bool) -> argparse.Namespace:
    """Parse the magic's line; bad flags raise :class:`OptionError` with the usage."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise OptionError(f"%modeldiff: {exc}\n{USAGE}") from None
    return _parser(cell).parse_args(words)


@magics_class
class ModelDiffMagics(Magics):
    """The ``modeldiff`` line and cell magic."""

    def _lookup(self, name: str) -> Any:
        ns = self.shell.user_ns  # type: ignore[union-attr]
        if name not in ns:
            raise OptionError(f"%modeldiff: no variable named {name!r} in the notebook.\n{USAGE}")
        return ns[name]

    def _pair(self, names: list[str] | None) -> list[Any] | None:
        return None if names is None else [self._lookup(n) for n in names]

    def _watch_cell(self, cell: str, base: Any, raw: Any, args: argparse.Namespace, options: dict) -> Any:
        from nbdiff.watch import watch

        if args.steps != 1 or args.loss or args.opt:
            raise OptionError(
                "%%modeldiff: --steps, --loss and --opt are for the line magic; in the cell, your code runs "
                f"the steps, losses and optimizers.\n{USAGE}"
            )
        options = {k: v for k, v in options.items() if k != "steps"}
        w = watch(base, raw, **options).__enter__()
        ok = False
        try:
            # run_cell shows the user's own traceback if the cell raises, as for any cell.
            ok = bool(self.shell.run_cell(cell, store_history=False).success)  # type: ignore[union-attr]
        finally:
            w.finish(compare=ok)
        if not ok:
            print("nbdiff: the cell raised, so nothing was compared; hooks are removed and modes restored.")
        return w.result

    @line_cell_magic
    def modeldiff(self, line: str, cell: str | None = None) -> Any:
        try:
            args = parse_flags(line, cell is not None)
            base, raw = self._lookup(args.base), self._lookup(args.raw)
            options = dict(
                atol=args.atol,
                rtol=args.rtol,
                compare_mode=args.mode,
                auto_init=not args.no_init,
                diff_phase=args.phase,
                single_step=args.single_step,
                steps=args.steps,
                api_level=args.api,
            )
            if cell is None:
                from nbdiff.diff import auto_diff

                result = auto_diff(
                    base,
                    raw,
                    self._lookup(args.inputs),
                    self._pair(args.loss),
                    self._pair(args.opt),
                    **options,  # type: ignore[arg-type]
                )
            else:
                result = self._watch_cell(cell, base, raw, args, options)
                if result is None:
                    return None
        except NbdiffError as exc:
            # One clear line (plus usage), not a traceback through nbdiff.
            print(f"{type(exc).__name__}: {exc}")
            return None
        self.shell.user_ns[args.out] = result  # type: ignore[union-attr]
        print(repr(result))
        from IPython.display import display

        display(result.show())
        return None
