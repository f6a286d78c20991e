"""lib/ has no import circles: the graph of its modules, with every import counted (also those
inside functions, which run when the function does), is acyclic. Read with ``ast``: nothing is
imported, so no torch."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.dvc_graph import REPO, _imports


def _graph() -> dict[Path, set[Path]]:
    lib = REPO / "lib"
    # A module inside a package "imports" the package's __init__.py on the way (Python runs it first);
    # that edge is no circle: by then the __init__ is already running or done.
    return {f: {g for g in _imports(f, REPO)[0]
                if lib in g.parents and g != f and not (g.name == "__init__.py" and g.parent in f.parents)}
            for f in lib.rglob("*.py")}


def _cycle(graph: dict[Path, set[Path]]) -> list[Path] | None:
    state: dict[Path, int] = {}
    stack: list[Path] = []

    def visit(node: Path) -> list[Path] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_lib_has_no_import_circles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(str(p.relative_to(REPO)) for p in cycle)


def test_the_cycle_finder_finds_a_circle() -> None:
    a, b, c = Path("a"), Path("b"), Path("c")
    assert _cycle({a: {b}, b: {c}, c: {a}}) == [a, b, c, a]
    assert _cycle({a: {b}, b: {c}, c: set()}) is None


# ----------------------------------------------------------------------------- layers

#: lib/ in layers, lowest first (docs/architecture.md draws the same picture): a module imports only
#: from its own layer or the layers below. A file entry wins over its folder's entry. Glue (stages/,
#: scripts/, benchmarks/) sits above every layer.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["lib/__init__.py", "lib/io.py", "lib/layout.py", "lib/pool.py", "lib/parallel.py",
                    "lib/paper.py", "lib/stats.py", "lib/model/config.py", "lib/model/spec.py"]),
    ("params", ["lib/params/", "lib/precision.py", "lib/cli.py"]),
    ("model, data, corpus", ["lib/model/", "lib/data/", "lib/corpus/"]),
    ("decode", ["lib/decode/"]),
    ("train", ["lib/train/"]),
    ("analysis", ["lib/analysis/"]),
    ("report", ["lib/report/"]),
]


def layer_of(rel: str, layers: list[tuple[str, list[str]]] = LAYERS) -> int:
    """The index of the layer ``rel`` (a path under the repository) belongs to."""
    for i, (_, entries) in enumerate(layers):
        if rel in entries:
            return i
    best = (-1, -1)
    for i, (_, entries) in enumerate(layers):
        for entry in entries:
            if entry.endswith("/") and rel.startswith(entry) and len(entry) > best[1]:
                best = (i, len(entry))
    if best[0] < 0:
        raise AssertionError(f"{rel}: in no layer of tests/test_imports.py's LAYERS (add it, and to docs/architecture.md)")
    return best[0]


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, list[str]]] = LAYERS) -> list[str]:
    """Every import of ``graph`` (relative paths) that runs from a layer to a higher one."""
    out = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            if layer_of(dst, layers) > layer_of(src, layers):
                out.append(f"{src} ({layers[layer_of(src, layers)][0]}) imports {dst} "
                           f"({layers[layer_of(dst, layers)][0]})")
    return out


def _docstring_only(path: Path) -> bool:
    """A package ``__init__.py`` with nothing but a docstring: importing it imports nothing."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def test_no_import_runs_up_a_layer() -> None:
    graph = {f.relative_to(REPO).as_posix(): {g.relative_to(REPO).as_posix() for g in targets
                                              if not (g.name == "__init__.py" and _docstring_only(g))}
             for f, targets in _graph().items()}
    assert not upward_imports(graph), "imports that run up a layer:\n" + "\n".join(upward_imports(graph))


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"lib/analysis/extract.py": {"lib/train/checkpoint.py", "lib/model/checkpoint.py"},
             "lib/params/__init__.py": {"lib/model/config.py"}, "lib/precision.py": {"lib/train/criterion.py"}}
    assert upward_imports(graph) == [
        "lib/precision.py (params) imports lib/train/criterion.py (train)"]
    assert layer_of("lib/model/spec.py") == 0 and layer_of("lib/model/attention/base.py") == 2
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("lib/new_package/thing.py")


def test_architecture_doc_draws_the_layers_of_this_table() -> None:
    """docs/architecture.md's picture (its first fenced block, highest layer first) puts every entry of
    :data:`LAYERS` on its layer's row: entries of one layer on one row, a lower layer further down."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    picture = doc.split("```")[1].splitlines()
    row: dict[str, int] = {}
    for name, entries in LAYERS:
        for entry in entries:
            if entry == "lib/__init__.py":
                continue
            token = entry.removeprefix("lib/")
            rows = [i for i, line in enumerate(picture) if token in line.split()]
            assert len(rows) == 1, f"docs/architecture.md's picture places {entry} ({name}) on {len(rows)} rows"
            row[entry] = rows[0]
    for i, (name, entries) in enumerate(LAYERS):
        lines = {row[e] for e in entries if e in row}
        assert len(lines) == 1, f"docs/architecture.md splits layer {name} over rows {sorted(lines)}"
        if i:
            below = {row[e] for e in LAYERS[i - 1][1] if e in row}
            assert lines.pop() < below.pop(), f"docs/architecture.md draws {name} below {LAYERS[i - 1][0]}"


def test_no_lib_module_is_over_600_lines() -> None:
    """One module per concept, readable top to bottom (docs/architecture.md): a module that outgrows
    600 lines is split, not grown."""
    lib = Path(__file__).resolve().parent.parent / "lib"
    long = {str(p.relative_to(lib.parent)): n for p in lib.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"split these modules: {long}"
