"""``nbdiff compare A B``: compare two dumps written by ``nbdiff.record``;
``nbdiff view RESULT``: a result saved by ``DiffResult.save`` as a standalone HTML page.

Exit status: 0 when the models agree, 1 when they diverge, 2 on an error (bad
arguments, unreadable or mismatched dumps).
"""

from __future__ import annotations

import argparse
import sys

from nbdiff.engine.spec import add_flags, from_flags
from nbdiff.errors import NbdiffError

__all__ = ["main"]

DESCRIPTION = """\
Find where two recorded models stop agreeing.

Record each model where it runs (its own process, machine, accelerator or rank):

    with nbdiff.record(model, "dumps/torch"):
        ...your training steps...

then compare the two dump folders, every step of every rank:

    nbdiff compare dumps/torch dumps/paddle --html report.html --json verdict.json

The first folder is the base (the reference), the second the raw model (the port).
Exit status: 0 aligned, 1 diverged, 2 error.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nbdiff", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser(
        "compare",
        help="compare two dump folders (base, raw)",
        description="Compare dump folder B (raw) against A (base): every step and every rank, with blame.",
    )
    c.add_argument("base", metavar="A", help="base dump folder (written by nbdiff.record)")
    c.add_argument("raw", metavar="B", help="raw dump folder")
    c.add_argument("--html", metavar="FILE", help="write a standalone HTML report (the notebook view, offline)")
    c.add_argument(
        "--json", metavar="FILE",
        help="write the verdict as JSON (format nbdiff-verdict, see the README); '-' prints it instead of the report",
    )  # fmt: skip
    c.add_argument("--csv", metavar="OUTDIR", help="write mapping/forward/backward/optimizer tables per step")
    add_flags(c, "atol", "rtol", "compare_mode", "framework_differences", "keep_steps")
    c.add_argument("--ignore-unmatched", action="store_true", help="compare common ranks/steps only")
    c.add_argument(
        "--shards", metavar="PATH=RULE", action="append", default=[],
        help="tensor parallelism nobody recorded: layer path pattern and its shard rule "
        "(column, row, row_partial, vocab, replicate), e.g. --shards 'layers.*.up=column'; repeatable",
    )  # fmt: skip
    v = sub.add_parser(
        "view",
        help="open a saved result (DiffResult.save) as HTML",
        description="Write a result saved by DiffResult.save as a standalone HTML report and open it in a browser.",
    )
    v.add_argument("result", metavar="RESULT", help="folder written by DiffResult.save")
    v.add_argument("--html", metavar="FILE", help="where to write the page (default: RESULT/report.html)")
    v.add_argument("--no-browser", action="store_true", help="only write the page and print its path")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad arguments, 0 on --help
        return int(exc.code or 0)
    commands = {"compare": _compare, "view": _view}
    if args.command not in commands:
        parser.print_help()
        return 2
    try:
        return commands[args.command](args)
    except NbdiffError as exc:
        print(f"nbdiff: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"nbdiff: {exc}", file=sys.stderr)
        return 2


def _compare(args: argparse.Namespace) -> int:
    from nbdiff.offline import compare

    result = compare(
        args.base, args.raw, ignore_unmatched=args.ignore_unmatched, shards=_shards(args.shards), **from_flags(args)
    )
    # With --json -, stdout carries the JSON alone (for a pipe); what people read goes to stderr.
    say = sys.stderr if args.json == "-" else sys.stdout
    print(result.report(), file=say)
    if args.json:
        text = result.to_json(args.json)
        print(text if args.json == "-" else f"JSON verdict: {args.json}", file=sys.stdout if args.json == "-" else say)
    if args.html:
        result.to_html(args.html)
        print(f"HTML report: {args.html}", file=say)
    if args.csv:
        files = result.to_csv(args.csv)
        print(f"{len(files)} CSV tables in {args.csv}", file=say)
    return 0 if result else 1


def _shards(given: list[str]) -> dict[str, str] | None:
    from nbdiff.errors import OptionError

    out = {}
    for item in given:
        path, eq, rule = item.rpartition("=")
        if not eq or not rule:
            raise OptionError(f"--shards {item!r}: expected PATH=RULE, e.g. 'layers.*.up=column'.")
        out[path] = rule
    return out or None


def _view(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nbdiff.report.saved import load_result

    result = load_result(args.result)
    page = result.to_html(args.html or str(Path(args.result) / "report.html"))
    print(result.report().splitlines()[0])
    print(f"HTML report: {page}")
    if not args.no_browser:
        import webbrowser

        webbrowser.open(Path(page).resolve().as_uri())  # a local file: nothing leaves the machine
    return 0  # viewing succeeded, whatever the result says (compare's status is the verdict)


if __name__ == "__main__":
    sys.exit(main())
