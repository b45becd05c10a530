"""Every path the README and docs/*.md name exists (issue 30: docs cited
``tracetool/ingest/store.py`` and ``tracetool/ingest/graph.py``, which are ``ingest/...``).

A path is a token starting at one of the repository's top-level folders (``tracetool/``,
``ingest/``, ``docs/``, ...), not inside a longer path, or a Markdown link's relative target
(resolved from the document's folder); ``../shared/traces/...`` paths are checked against
the corpus when it is present. Globs must match something."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._util import REPO, SHARED_TRACES

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = sorted(p.name for p in REPO.iterdir()
             if p.is_dir() and not p.name.startswith(".") and not p.name.endswith("egg-info")
             and p.name not in ("out",))
# a repo path: a top-level folder, then path characters; not preceded by a path character
# (so the tests/ of facebookresearch__param/et_replay/tests/... is not one)
TOPS = "|".join(map(re.escape, TOP))
REPO_PATH = re.compile(rf"(?<![\w./~:-])(?:{TOPS})/[\w.*/-]*")
CORPUS_PATH = re.compile(r"\.\./shared/traces/[\w.*/-]+")
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)")


def named_paths(doc: Path) -> list[tuple[str, Path]]:
    """(as written, where it must be) for every path the document names."""
    text = doc.read_text()
    out = [(m.group(0), REPO / m.group(0)) for m in REPO_PATH.finditer(text)]
    out += [(m.group(1), (doc.parent / m.group(1)).resolve()) for m in LINK.finditer(text)]
    if SHARED_TRACES.is_dir():
        out += [(m.group(0), REPO.parent / m.group(0)[3:]) for m in CORPUS_PATH.finditer(text)]
    return out


def exists(path: Path) -> bool:
    """The path, or for a glob something it matches (a trailing '.' or ',' is prose)."""
    s = str(path).rstrip(".,")
    if "*" in s:
        return any(Path("/").glob(s.lstrip("/")))
    return Path(s).exists()


def test_the_pattern_finds_paths_and_skips_other_repos_paths() -> None:
    """The extraction itself: a cited module, a link, a glob; not a corpus repo's tests/."""
    assert [m.group(0) for m in REPO_PATH.finditer(
        "see `tracetool/ingest/store.py` and tracetool/gpus/*.toml, "
        "facebookresearch__param/et_replay/tests/inputs/x.json")] == [
        "tracetool/ingest/store.py", "tracetool/gpus/*.toml"]
    assert LINK.findall("[a](docs/steps.md#x) [b](https://x.org/a.md) [c](#here)") == [
        "docs/steps.md"]
    assert not exists(REPO / "tracetool/ingest/store.py") and exists(REPO / "ingest/store.py")
    assert exists(REPO / "tracetool/gpus/*.toml") and not exists(REPO / "tracetool/gpus/*.json")


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(REPO).as_posix() for d in DOCS])
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    named = named_paths(doc)
    assert named or doc.name != "README.md"  # the README names paths: the pattern sees them
    missing = sorted({text for text, path in named if not exists(path)})
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"
