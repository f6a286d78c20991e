"""Static view of the DVC graph for tests: each stage's import closure inside the repository,
read with ``ast`` (no module is imported, so no torch), and dvc.yaml's stages as written.

Every ``import`` counts, including imports inside functions (they run when the stage runs).
"""
from __future__ import annotations

import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _module_file(module: str, root: Path) -> Path | None:
    """lib.train.run -> lib/train/run.py (or lib/train/__init__.py for a package); None if the
    module is not in the repository."""
    parts = module.split(".")
    base = root.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _lazy_names(init: Path) -> dict[str, str]:
    """A package's ``_LAZY = {name: submodule}``: the names its ``__getattr__`` imports from a submodule on
    first use (lib/model/attention/__init__.py: the variants'), which a plain reading of ``from package
    import name`` would not see."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) \
                and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def _imports(path: Path, root: Path) -> tuple[set[Path], set[str]]:
    """(repository files, top-level third-party module names) imported by ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    files: set[Path] = set()
    external: set[str] = set()

    def add_module(module: str) -> None:
        parts = module.split(".")
        found = False
        for i in range(1, len(parts) + 1):  # every package on the way is imported too
            f = _module_file(".".join(parts[:i]), root)
            if f is not None:
                files.add(f)
                found = True
        if not found:
            # a sibling module of a stage script (stages/ is on sys.path when the script runs)
            sibling = path.parent / f"{parts[0]}.py"
            if sibling.is_file():
                files.add(sibling)
            else:
                external.add(parts[0])

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the file's package
                pkg = path.parent
                for _ in range(node.level - 1):
                    pkg = pkg.parent
                module = ".".join(pkg.relative_to(root).parts + ((node.module,) if node.module else ()))
            else:
                module = node.module or ""
            add_module(module)
            package = _module_file(module, root)
            lazy = _lazy_names(package) if package is not None and package.name == "__init__.py" else {}
            for alias in node.names:  # `from lib import layout` imports the module lib/layout.py
                sub = _module_file(f"{module}.{alias.name}", root)
                if sub is None and alias.name in lazy:  # a name the package imports from a submodule on use
                    sub = _module_file(f"{module}.{lazy[alias.name]}", root)
                if sub is not None:
                    files.add(sub)
    return files, external


def import_closure(script: Path, root: Path = REPO) -> tuple[set[Path], set[str]]:
    """(repository files, third-party top-level modules) that running ``script`` may import."""
    todo, seen, external = [script.resolve()], set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        files, ext = _imports(path, root)
        external |= ext
        todo.extend(f.resolve() for f in files if f.resolve() not in seen)
    return seen, external


def dvc_stages(root: Path = REPO) -> dict[str, dict]:
    """dvc.yaml's stages as written (templates unresolved)."""
    return yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def stage_script(stage: dict, root: Path = REPO) -> Path:
    """The ``stages/<name>.py`` that a stage's ``cmd`` runs."""
    words = stage["cmd"].split()
    scripts = [w for w in words if w.startswith("stages/") and w.endswith(".py")]
    if len(scripts) != 1:
        raise ValueError(f"cmd {stage['cmd']!r} runs no single stages/*.py script")
    return root / scripts[0]


def code_deps(stage: dict) -> list[str]:
    """The stage's deps inside stages/ and lib/ (the code it declares)."""
    return [d for d in stage.get("deps", []) if isinstance(d, str) and d.startswith(("stages/", "lib/"))]


def covered(path: Path, deps: list[str], root: Path = REPO) -> bool:
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    return any(rel == d.rstrip("/") or rel.startswith(d.rstrip("/") + "/") for d in deps)
