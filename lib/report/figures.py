"""How the report links its figures: relative to the folder the report is written to.

The pipeline's report (reports/report.md) links every figure where its stage wrote it (plots/, tracked in
git). An archived report of an opt-in experiment (``python stages/report.py --archive reports/<name>``)
copies the figures of the experiment's own stages (plots/variants/: band test, smoothing, head selection)
beside itself, since those stages are not part of the default pipeline and their plots are not committed,
and leaves out the default stages' figures, which the main report shows.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["Figures"]


class Figures:
    def __init__(self, root: Path, out_dir: Path | None = None, archive: bool = False) -> None:
        self.root = Path(root)
        self.out_dir = Path(out_dir) if out_dir is not None else self.root / "reports"
        self.archive = archive
        self.copied: list[Path] = []

    def link(self, path: Path, alt: str | None = None) -> str:
        """``![alt](relative path)\\n`` for the figure at ``path`` (inside the repository), or "" when an
        archive leaves it out (a figure of the default pipeline) or it does not exist."""
        path = Path(path)
        alt = path.stem if alt is None else alt
        if not self.archive:
            return f"![{alt}]({Path(os.path.relpath(path, self.out_dir)).as_posix()})\n"
        rel = path.relative_to(self.root)
        if rel.parts[:2] != ("plots", "variants") or not path.is_file():
            return ""
        target = self.out_dir / "_".join(rel.parts[2:])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        self.copied.append(target)
        return f"![{alt}]({target.name})\n"

    def folder(self, folder: Path) -> str:
        """Every PNG of ``folder`` (sorted), as :meth:`link` gives them."""
        pngs = sorted(Path(folder).glob("*.png")) if Path(folder).is_dir() else []
        return "".join(self.link(p) for p in pngs)
