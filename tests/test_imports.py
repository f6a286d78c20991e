"""lib/ has no import circles: the graph of its modules, with every import counted (also those
inside functions, which run when the function does), is acyclic. Read with ``ast``: nothing is
imported, so no torch."""
from __future__ import annotations

from pathlib import Path

from tests.dvc_graph import REPO, _imports


def _graph() -> dict[Path, set[Path]]:
    lib = REPO / "lib"
    return {f: {g for g in _imports(f, REPO)[0] if lib in g.parents and g != f} for f in lib.rglob("*.py")}


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
