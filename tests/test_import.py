"""`import nbdiff` must not import either framework: users of one should not pay for the other."""

import subprocess
import sys


def test_import_nbdiff_imports_neither_framework():
    code = "import nbdiff, sys; print('torch' in sys.modules, 'paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_module_is_reached_by_its_dotted_name_after_import_nbdiff():
    # The function nbdiff.compare shadowed the package nbdiff.compare: `import nbdiff.compare.metrics
    # as m` raised ImportError, and `import nbdiff.record as r` gave the class, not the module.
    code = """
import importlib, pkgutil, sys
import nbdiff
for m in pkgutil.walk_packages(nbdiff.__path__, "nbdiff."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
for name in sorted(n for n in sys.modules if n.startswith("nbdiff.")):
    parent, _, leaf = name.rpartition(".")
    if getattr(sys.modules[parent], leaf, None) is not sys.modules[name]:
        print(name)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []


def _import_graph() -> dict[str, set[str]]:
    """Which nbdiff module imports which, read from the source: lazy imports inside functions count."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "nbdiff"
    files = {}
    for f in root.rglob("*.py"):
        parts = f.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, f in files.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[mod] |= {next(n for n in names if n in files)} if any(n in files for n in names) else set()
    return graph


# The documented shortcuts: DiffResult's methods draw, print, save and reproduce it (each imports
# its renderer when called), and LayerMap.auto proposes a map by running the models.
_FACADES = {("nbdiff.result", "nbdiff.report"), ("nbdiff.result", "nbdiff.view"), ("nbdiff.result", "nbdiff.notebook"),
            ("nbdiff.align.layer_map", "nbdiff.align.auto_map")}  # fmt: skip


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen, cycles = set(), []
    for start in graph:
        stack, path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                seen.add(node)
            elif nxt in path:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in seen:
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return cycles


def test_no_circle_of_imports_but_the_documented_facades():
    graph = {
        m: {t for t in ts if not any(m == a and t.startswith(b) for a, b in _FACADES)}
        for m, ts in _import_graph().items()
    }
    assert _cycles(graph) == []


def test_imports_point_one_way_between_the_stages():
    # The core compares, the engine runs a step, the report, the view and the notebook show, the
    # verbs drive. judge/blame reached up into report/repro, and report/html and notebook/widget
    # imported each other's half of the view.
    core = ["errors", "frameworks", "trace", "align", "gather", "judge", "weights"]
    rank = {**dict.fromkeys(core, 0), "result": 1, "engine": 2, "report": 3, "view": 4}

    def rank_of(mod: str) -> int:
        return rank.get(mod.split(".")[1] if mod.count(".") else "", 5)  # notebook, the verbs, the CLI, the shims

    wrong = [
        f"{mod} -> {t}"
        for mod, targets in _import_graph().items()
        for t in targets
        if rank_of(t) > rank_of(mod) and not any(mod == a and t.startswith(b) for a, b in _FACADES)
    ]
    assert wrong == []


def test_the_engines_rooms_import_its_spine_and_never_each_other():
    # Where a step comes from (engine/live: the models; engine/recorded: the dumps) is a room each: the
    # shared comparison (the engine's other modules) imports neither, and neither imports the other.
    rooms = ("nbdiff.engine.live", "nbdiff.engine.recorded")

    def room_of(mod: str) -> str | None:
        return next((r for r in rooms if mod == r or mod.startswith(r + ".")), None)

    wrong = [
        f"{mod} -> {t}"
        for mod, targets in _import_graph().items()
        if mod.startswith("nbdiff.engine")
        for t in targets
        if room_of(t) is not None and room_of(t) != room_of(mod)
    ]
    assert wrong == []


def test_the_rest_of_trace_records_and_never_reads_or_writes_a_dump():
    # trace/dump is the format on disk: recording (the recorder, its session, stacks, statistics) must not
    # depend on it, so that a check in memory never loads the writer and the reader.
    wrong = [
        f"{mod} -> {t}"
        for mod, targets in _import_graph().items()
        if mod.startswith("nbdiff.trace") and not mod.startswith("nbdiff.trace.dump")
        for t in targets
        if t.startswith("nbdiff.trace.dump")
    ]
    assert wrong == []


def test_the_verbs_stay_thin_and_watchs_hooks_only_record():
    # A verb checks options, copies weights and hands steps to the engine: pairing, the pairing probe,
    # feeding raw base's values and comparing a step happen there (watch's at the step boundary,
    # nbdiff.engine.live.boundary), never in the verb's module or inside its hooks.
    graph = _import_graph()
    engine_work = {
        "nbdiff.align.pairing", "nbdiff.align.probe", "nbdiff.engine.live.feed", "nbdiff.trace.structure",
        "nbdiff.engine.comparer", "nbdiff.engine.recorded.comparer",
    }  # fmt: skip
    verbs = ("nbdiff.watching", "nbdiff.diff", "nbdiff.offline")
    assert {v: sorted(graph[v] & engine_work) for v in verbs} == {v: [] for v in verbs}


def test_where_a_record_comes_from_reads_nothing_of_the_recording():
    # trace/origin (stacks, cells, where and with what a layer was built) is read by the recorder, the
    # dump and the view alike; it must not pull the recorder in.
    wrong = [
        f"{mod} -> {t}"
        for mod, targets in _import_graph().items()
        if mod.startswith("nbdiff.trace.origin")
        for t in targets
        if t.startswith("nbdiff.trace") and not t.startswith("nbdiff.trace.origin")
    ]
    assert wrong == []
