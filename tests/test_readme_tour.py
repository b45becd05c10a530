"""The README's tour, its replay examples and its worked examples run as written: every
``tracetool`` command of their shell blocks, in order, in a directory laid out like the
repository (``sample_traces/`` and ``../shared`` beside it), each with the exit code the README
gives it. A shell block followed directly by a ```text block is a command and its answer:
every line of the answer must be a line the block's last command prints (answers may leave
lines out, never change one)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracetool.cli import cli

from ._util import REPO, SHARED_TRACES

# (heading, how many of its shell blocks: the later ones of the replay section are templates)
SECTIONS = (("## A 5-minute tour", None), ("## Replay: the model", 1),
            ("## Worked examples", None))


def _section(readme: str, heading: str) -> str:
    """The text under ``heading``, up to the next ``## `` heading."""
    start = readme.index(heading + "\n")
    end = readme.find("\n## ", start + len(heading))
    return readme[start:end if end >= 0 else len(readme)]


def shell_blocks(readme: str, heading: str) -> list[str]:
    """The ```sh blocks of the section under ``heading`` (up to the next ``## `` heading)."""
    return re.findall(r"```sh\n(.*?)```", _section(readme, heading), flags=re.S)


def answers(readme: str, heading: str) -> dict[str, list[str]]:
    """The section's ```sh blocks that a ```text block follows directly, each with the
    lines of that answer."""
    return {sh: text.splitlines() for sh, text in re.findall(
        r"```sh\n((?:(?!```).)*)```\s*```text\n((?:(?!```).)*)```", _section(readme, heading),
        flags=re.S)}


def commands(block: str, env: dict[str, str] | None = None) -> list[list[str]]:
    """The block's ``tracetool`` commands as argument lists: continuation lines joined,
    comments dropped, ``NAME=value`` assignments substituted for ``$NAME`` (``env``: those
    of the earlier blocks, as in one shell, updated)."""
    text = re.sub(r"\\\n\s*", " ", block)
    env = {} if env is None else env
    out = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S+", words[0]):
            name, value = words[0].split("=", 1)
            env[name] = value
        elif words and words[0] == "tracetool":
            out.append([re.sub(r"\$([A-Z_]+)", lambda m: env[m.group(1)], w)
                        for w in words[1:]])
    return out


def test_commands_are_parsed() -> None:
    block = "# c\nSRC=a=1,b=2\ntracetool replay s --x $SRC \\\n    --y 'n~f=2'  # note\n"
    assert commands(block) == [["replay", "s", "--x", "a=1,b=2", "--y", "n~f=2"]]


def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"the tour reads {SHARED_TRACES}")
    readme = (REPO / "README.md").read_text()
    # (command, the answer its output must show, if any): the last command of a block
    cmds: list[tuple[list[str], list[str]]] = []
    for h, n in SECTIONS:
        answered = answers(readme, h)
        env: dict[str, str] = {}
        for b in shell_blocks(readme, h)[:n]:
            block = commands(b, env)
            cmds += [(c, answered.get(b, []) if i == len(block) - 1 else [])
                     for i, c in enumerate(block)]
    assert len(cmds) >= 30, "the tour's commands were not found"
    assert sum(bool(a) for _, a in cmds) >= 5, "the worked examples' answers were not found"
    root = tmp_path / "repo"
    root.mkdir()
    (root / "sample_traces").symlink_to(REPO / "sample_traces")
    (tmp_path / "shared").symlink_to(SHARED_TRACES.parent)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for args, answer in cmds:
            res = CliRunner().invoke(cli, args, catch_exceptions=False)
            # the diff's gate is meant to trip (the README says so): exit 1 with the gate's line
            want = 1 if args[0] == "diff" and "--fail-if" in args else 0
            assert res.exit_code == want, (args, res.output[-500:])
            assert "Traceback" not in res.output
            printed = res.stdout.splitlines()
            missing = [line for line in answer if line not in printed]
            assert not missing, (args, missing, res.stdout[-2000:])
    finally:
        os.chdir(cwd)
    assert (root / "out" / "report" / "report.html").is_file()
    assert (root / "out" / "sweep" / "sweep.csv").is_file()
    assert (root / "out" / "report-2dc" / "report.md").read_text().count(
        "| intra+inter+dc |") == 2  # the worked example's collectives by link
    assert (root / "out" / "sweep-power" / "sweep.csv").is_file()
