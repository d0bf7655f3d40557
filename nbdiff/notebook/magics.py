"""``%modeldiff`` (line) and ``%%modeldiff`` (cell): auto_diff from the notebook, shown as the view.

Line: ``%modeldiff BASE RAW INPUTS [flags]`` runs :func:`nbdiff.auto_diff` on the named
variables. Cell: ``%%modeldiff BASE RAW [flags]`` records both models while the cell
body runs the user's own training code (base first, then raw, every step).
"""

from __future__ import annotations

import argparse
import builtins
import keyword
import re
import shlex
from typing import Any, NoReturn

from IPython.core.magic import Magics, line_cell_magic, magics_class

from nbdiff.engine.spec import add_flags, from_flags
from nbdiff.errors import NbdiffError, OptionError
from nbdiff.frameworks.interrupts import is_interrupt
from nbdiff.trace.spool import MEMORY_MIB

__all__ = ["ModelDiffMagics", "USAGE", "parse_flags", "CellFailed", "CellInterrupted"]

USAGE = (
    "usage: %modeldiff BASE RAW [INPUTS] --check   (pre-flight: arguments that differ, no training)\n"
    "       %modeldiff BASE RAW INPUTS [--single-step] [--steps N] [--atol X] [--rtol X] "
    "[--mode strict|mean|abs_mean] [--phase both|forward|backward] [--loss A B] [--opt A B] "
    "[--no-init] [--api] [--memory-mib N|none] [--out NAME]\n"
    "       %%modeldiff BASE RAW [same flags, without INPUTS] [--keep-steps N]"
)


# IPython's own names (In, Out, _, _i3, _oh, ...): replacing one breaks the shell.
_IPYTHON_NAME = re.compile(r"_+|_i+|_i?\d+|_[io]h|_dh|_sh|In|Out|get_ipython|exit|quit")


class CellFailed(NbdiffError):
    """The ``%%modeldiff`` cell raised: its traceback is shown above; this fails the cell too."""

    def _render_traceback_(self) -> list[str]:
        return [f"nbdiff: {self}"]


class CellInterrupted(KeyboardInterrupt):
    """The ``%%modeldiff`` cell was interrupted; raised again so that "Run All" stops."""

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


def check_out_name(name: str, hidden: dict[str, Any]) -> None:
    """``--out`` must be a plain variable name that neither IPython nor Python relies on."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise OptionError(f"%modeldiff: --out {name!r} is not a Python variable name.\n{USAGE}")
    if name.startswith("__") or _IPYTHON_NAME.fullmatch(name) or name in hidden or hasattr(builtins, name):
        raise OptionError(
            f"%modeldiff: --out {name!r} would replace a name Python or IPython relies on; pick another, "
            f"such as --out diff_result.\n{USAGE}"
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit the kernel's process
        raise OptionError(f"%modeldiff: {message}\n{USAGE}")


def _mib(text: str) -> float | None:
    """``--memory-mib``: a number of MiB, or ``none`` (no limit)."""
    return None if text.lower() == "none" else float(text)


def _parser(cell: bool) -> argparse.ArgumentParser:
    p = _Parser(prog="%%modeldiff" if cell else "%modeldiff", add_help=False)
    p.add_argument("base")
    p.add_argument("raw")
    if not cell:
        p.add_argument("inputs", nargs="?")
        p.add_argument("--check", action="store_true", help="list differing layer arguments; runs no training")
    p.add_argument("--single-step", action="store_true")
    p.add_argument("--steps", type=int, default=1)
    add_flags(
        p, "atol", "rtol", "compare_mode", "diff_phase", "framework_differences", *(("keep_steps",) if cell else ())
    )
    p.add_argument("--loss", nargs=2, metavar=("A", "B"))
    p.add_argument("--opt", nargs=2, metavar=("A", "B"))
    p.add_argument("--no-init", action="store_true")
    p.add_argument("--api", action="store_true", help="also trace framework API calls inside layers")
    p.add_argument("--memory-mib", type=_mib, default=MEMORY_MIB, help="recording held in memory (0: bounded)")
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
        from nbdiff.watching import watch

        if args.steps != 1 or args.loss or args.opt:
            raise OptionError(
                "%%modeldiff: --steps, --loss and --opt are for the line magic; in the cell, your code runs "
                f"the steps, losses and optimizers.\n{USAGE}"
            )
        options = {k: v for k, v in options.items() if k != "steps"}
        # A notebook keeps every result it showed (a widget, Out): their tensors wait in a file.
        options.update(keep_steps=args.keep_steps, spill_above_mib=0)
        w = watch(base, raw, **options).__enter__()
        run = None
        shell: Any = self.shell
        # The body runs under this cell's own execution count, so its frames read "Cell In [n]".
        outer = getattr(shell.displayhook, "exec_result", None)
        count = shell.execution_count
        shell.execution_count = getattr(outer, "execution_count", None) or count
        try:
            # run_cell shows the user's own traceback if the cell raises, as for any cell. The comment
            # stands for the magic's line, so line numbers match the editor's.
            run = shell.run_cell("# %%modeldiff\n" + cell, store_history=False)
        finally:
            shell.execution_count = count
            if run is None:  # run_cell itself raised: nothing of the cell's is compared
                w.finish(compare=False)
            else:
                error = None if run.success else (run.error_in_exec or run.error_before_exec or RuntimeError())
                w.end_after(error)
        stopped = error is not None and is_interrupt(error)  # paddle raises a Ctrl-C in its backward as OSError
        if not run.success:
            done = "nbdiff removed its hooks and restored modes; nothing was compared."
            if stopped:
                if w.result is not None:
                    # The complete steps are the answer so far: kept and shown before stopping "Run All",
                    # said before the view (under it, a long view hid the line).
                    shell.user_ns[args.out] = w.result
                    from IPython.display import display

                    print(
                        f"nbdiff: the cell was interrupted; the {w.result.steps} step(s) both models completed were "
                        f"compared (below, and in `{args.out}`)."
                    )
                    display(w.result.show())
                    done = f"nbdiff removed its hooks and restored modes; the steps compared are shown above, in `{args.out}`."
                raise CellInterrupted(f"the cell was interrupted; {done}")
            # Raised again, so that "Run All" and nbconvert --execute stop here.
            raise CellFailed(f"the cell raised {type(error).__name__} (traceback above); {done}")
        return w.result

    @line_cell_magic
    def modeldiff(self, line: str, cell: str | None = None) -> Any:
        """Errors fail the cell (so "Run All" stops) and show one message, not nbdiff's internals."""
        args = parse_flags(line, cell is not None)
        check_out_name(args.out, self.shell.user_ns_hidden)  # type: ignore[union-attr]
        base, raw = self._lookup(args.base), self._lookup(args.raw)
        if cell is None and args.check:
            from nbdiff.check import check_config

            found = check_config(base, raw, self._lookup(args.inputs) if args.inputs else None)
            self.shell.user_ns[args.out] = found  # type: ignore[union-attr]
            return found
        if cell is None and args.inputs is None:
            raise OptionError(f"%modeldiff: INPUTS is missing (or pass --check for the pre-flight).\n{USAGE}")
        flags = {k: v for k, v in from_flags(args).items() if k != "keep_steps"}  # the cell's, given below
        options = dict(
            auto_init=not args.no_init,
            single_step=args.single_step,
            steps=args.steps,
            api_level=args.api,
            memory_mib=args.memory_mib,
            **flags,
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
        self.shell.user_ns[args.out] = result  # type: ignore[union-attr]
        from IPython.display import display

        # The view's headline says it (a `<DiffResult …>` line printed above it said it twice).

        display(result.show())
        return None
