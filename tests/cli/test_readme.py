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


def _resume_block() -> list[tuple[str, list[str]]]:
    """The checkpoint-and-replan block: (command, the output lines shown under it)."""
    text = ROOT.joinpath("README.md").read_text()
    block = text.split("re-plan for 3 from the old plan (no tracing), resume:", 1)[1].split("```", 2)[1]
    steps: list[tuple[str, list[str]]] = []
    for line in block.replace("\\\n", " ").splitlines():
        if not line.strip():
            continue
        if line.startswith("    "):
            steps[-1][1].append(line.strip())
        else:
            steps.append((line.split("#", 1)[0].strip(), []))
    return steps


@pytest.mark.slow
def test_the_resume_example_runs_as_written_and_prints_what_it_shows(repo_like):
    """Train on 4 ranks, replan for 3, resume, replan for 1: the losses the README shows, to 1e-5."""
    import os
    import re
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for command, shown in _resume_block():
        args = shlex.split(command)
        if args[0] == "torchrun":
            args = [sys.executable, "-m", "torch.distributed.run", "--master_port", "29533", *args[1:]]
        elif args[0] == "python":
            args = [sys.executable, *args[1:]]
        run = subprocess.run(args, cwd=repo_like, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (command, run.stdout[-2000:], run.stderr[-2000:])
        got = {int(n): float(x) for n, x in re.findall(r"^step (\d+) loss ([0-9.]+)", run.stdout, re.M)}
        for line in shown:
            for n, x in re.findall(r"step (\d+) loss ([0-9.]+)", line):
                assert abs(got[int(n)] - float(x)) <= 1e-5, (command, n, got.get(int(n)), x)
            if line.startswith("resumed from"):
                assert line in run.stdout, (command, run.stdout[-2000:])
    assert (repo_like / "weights.pt").exists()
