"""Imports go one way: the store's schema at the bottom, then ingest and analysis (which know
nothing of each other), then replay (over analysis), the CLI on top. Checked on the source
of every module, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

from ._util import REPO

# package directory -> (its import name, the layers it may import besides itself)
LAYERS = {
    "tracetool": ("tracetool", set()),  # schema, store_views, sqltext, dtypes, opwork, hardware
    "ingest": ("tracetool.ingest", {"tracetool"}),
    "analysis": ("tracetool.analysis", {"tracetool"}),
    "replay": ("tracetool.replay", {"tracetool", "tracetool.analysis"}),
    "tracetool/cli": ("tracetool.cli", {"tracetool", "tracetool.ingest", "tracetool.analysis",
                                        "tracetool.replay"}),
}
# the package's front doors: tracetool.connect() opens the analysis lazily, and
# ``python -m tracetool`` runs the CLI
FRONT_DOOR = {("tracetool/__init__.py", "tracetool.analysis.connect"),
              ("tracetool/__main__.py", "tracetool.cli")}


def layer_of(module: str) -> str | None:
    """The layer a tracetool module belongs to (the longest package prefix)."""
    names = sorted((name for name, _ in LAYERS.values()), key=len, reverse=True)
    return next((n for n in names if module == n or module.startswith(n + ".")), None)


def imports_of(path: Path, package: str) -> list[str]:
    """Absolute names of every tracetool module ``path`` imports (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = package.split(".")  # a module's package is its directory's
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "tracetool"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[:len(parts) - node.level + 1]
                out.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module and node.module.split(".")[0] == "tracetool":
                out.append(node.module)
    return out


def test_imports_go_one_way() -> None:
    bad, seen = [], 0
    for directory, (package, allowed) in LAYERS.items():
        files = sorted((REPO / directory).glob("*.py"))
        assert files, directory
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            for name in imports_of(f, package):
                seen += 1
                target = layer_of(name)
                if target in (package, None) or target in allowed:
                    continue
                if (rel, name) in FRONT_DOOR:
                    continue
                bad.append(f"{rel} imports {name}")
    assert seen > 50  # the walk found the imports
    assert bad == []


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from tracetool.replay.run import Replayer\n"
                 "from ..analysis import connect\n")
    names = imports_of(f, "tracetool.ingest")
    assert sorted(names) == ["tracetool.analysis", "tracetool.replay.run"]
    assert {layer_of(n) for n in names} == {"tracetool.replay", "tracetool.analysis"}
