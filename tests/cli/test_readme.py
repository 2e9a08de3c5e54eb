"""The README's command block under "## Use" runs as written: every ``hapc`` line, in order,
from a folder laid out like the repository (its relative paths), exits 0."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from hapc.cli import main

ROOT = Path(__file__).resolve().parents[2]
SLOW = ("hapc ir ", "hapc rules --check")       # a full-size trace; every rule checked: minutes


def use_commands() -> list[str]:
    """The ``hapc`` lines of the first code block after "## Use", continuations joined,
    comments dropped."""
    text = ROOT.joinpath("README.md").read_text()
    block = text.split("## Use", 1)[1].split("```", 2)[1]
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.strip().startswith("hapc ")]


@pytest.fixture
def repo_like(tmp_path, monkeypatch):
    for name in ("configs", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_the_use_block_has_the_commands_a_user_reads():
    commands = use_commands()
    assert [c.split()[1] for c in commands] == ["compile", "explain", "simulate", "check", "ir", "rules"]


@pytest.mark.parametrize("slow", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fast", "slow"])
def test_the_use_block_runs_as_written(repo_like, capsys, slow):
    for command in use_commands():
        if command.startswith(SLOW) and not slow:
            continue
        assert main(shlex.split(command)[1:]) == 0, (command, capsys.readouterr())


def test_the_first_python_snippet_runs_as_written(repo_like, capsys):
    text = ROOT.joinpath("README.md").read_text()
    snippet = text.split("From Python:", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(snippet, "README.md", "exec"), {})
    assert (repo_like / "plan.json").exists() and "hapc plan" in capsys.readouterr().out
