"""plan.json is data from outside: whatever it holds, loading it ends in a plan or in one line
naming the file and what is wrong (exit 2), never a traceback, an "internal error", or a plan
that silently means something else (shares summing to 2, an unknown collective)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hapc.cli import main

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _edited(tmp_path: Path, edit) -> Path:
    data = json.loads((GOLDEN / "gpt-small-mixed.json").read_text())
    text = edit(data)
    path = tmp_path / "plan.json"
    path.write_text(text if isinstance(text, str) else json.dumps(data))
    return path


EDITS = {
    "shares summing to 2": (lambda d: d.update(shares=[x * 2 for x in d["shares"]]), r"shares: expected non-negative"),
    "a negative share": (lambda d: d.update(shares=[-0.5, 1.5] + d["shares"][2:]), r"shares: expected non-negative"),
    "an unknown method": (lambda d: [s.update(method="rm -rf") for s in d["steps"] if "redistribute" in s],
                          r"steps: unknown collective method 'rm -rf'"),
    "no steps": (lambda d: d.pop("steps"), r"not a valid plan file \(missing 'steps'\)"),
    "shares as text": (lambda d: d.update(shares="0.5,0.5"), r"shares: expected"),
    "deep nesting": (lambda d: '{"format": ' + "[" * 100000 + "]" * 100000 + "}", r"not a plan file"),
    "a huge number": (lambda d: '{"format": ' + "9" * 50000 + "}", r"not a plan file"),
    "a negative shortfall": (lambda d: d.update(baselines_short_bytes={"dp-even": -1}),
                             r"baselines_short_bytes: expected baseline names and non-negative byte counts"),
    "a huge cluster": (lambda d: d["cluster"]["nodes"][0].update(count=10**12), r"at most \d+"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_bad_plan_is_one_line_naming_the_file(tmp_path, capsys, edit):
    change, message = EDITS[edit]
    path = _edited(tmp_path, change)
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err, err
    assert __import__("re").search(message, err), err


def test_the_golden_plans_still_load(capsys):
    for path in sorted(GOLDEN.glob("*.json")):
        assert main(["simulate", str(path)]) == 0, path
