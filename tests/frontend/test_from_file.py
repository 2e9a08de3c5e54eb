"""One path from a model file to a traced graph (hapc.frontend.from_file): ``hapc compile`` and
``synthesize("model.py")`` both go through it, get the same graph and plan, and both keep the
node strategies with the cache entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapc.cli import main
from hapc.frontend import from_file

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "configs" / "models" / "mlp.py"
SMALL_MIXED = str(ROOT / "configs" / "clusters" / "small-mixed.yaml")
KWARGS = {"layers": 2, "features": 12, "hidden": 16, "classes": 5, "batch": 4}


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """Every trace_file call, with its command_line flag."""
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[bool] = []
    inner = from_file.trace_file

    def recording(*args, **kwargs):
        seen.append(kwargs.get("command_line", False))
        return inner(*args, **kwargs)

    monkeypatch.setattr(from_file, "trace_file", recording)
    return seen


def test_compile_and_synthesize_take_the_same_path(calls, tmp_path, capsys):
    from hapc import synthesize
    from hapc.plan import Plan

    sets = [x for k, v in KWARGS.items() for x in ("--set", f"{k}={v}")]
    assert main(["compile", str(MLP), "--cluster", SMALL_MIXED, "-q", "--no-emit", "--no-trace-cache",
                 "-o", str(tmp_path / "out"), *sets]) == 0
    plan = synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=KWARGS, trace_cache=False)
    assert calls == [True, False]
    compiled = Plan.load(tmp_path / "out" / "plan.json")
    assert compiled.graph.hash() == plan.graph.hash() and compiled.cost == pytest.approx(plan.cost, rel=1e-9)


def test_both_keep_the_strategies_with_the_entry(calls, tmp_path, capsys):
    from hapc import synthesize

    sets = [x for k, v in KWARGS.items() for x in ("--set", f"{k}={v}")]
    assert main(["compile", str(MLP), "--cluster", SMALL_MIXED, "-q", "--no-emit", "-o", str(tmp_path / "o"),
                 *sets]) == 0
    assert len(list((tmp_path / "cache").glob("*.strategies-fp32.json"))) == 1
    synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=KWARGS, precision="bf16")
    assert len(list((tmp_path / "cache").glob("*.strategies-bf16.json"))) == 1
    assert calls == [True, False]


class _Entry:
    """A stand-in for a child writing a cache entry."""

    def __init__(self) -> None:
        self.waited = False
        self.closed: list[bool] = []

    def path(self) -> None:
        self.waited = True

    def close(self, *, interrupted: bool) -> None:
        self.closed.append(interrupted)


@pytest.mark.parametrize("error, waits, interrupted", [(None, True, False), (ValueError, True, False),
                                                        (KeyboardInterrupt, False, True)])
def test_a_child_writing_the_entry_ends_with_the_caller(error, waits, interrupted):
    """After success or an error the entry may be finished (the next run finds the trace);
    after Ctrl-C the writer is stopped at once."""
    entry = _Entry()
    with pytest.raises(error) if error else _nothing():
        with from_file.ModelFileTrace(object(), entry, cache=None):
            if error:
                raise error
    assert entry.waited is waits and entry.closed == [interrupted]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
