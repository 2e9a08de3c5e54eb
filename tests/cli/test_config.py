"""hapc compile --config FILE: options from TOML or YAML, flags override them, and a wrong key or
type is one line naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hapc.cli import main

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "configs" / "models" / "mlp.py")
SMALL_MIXED = str(ROOT / "configs" / "clusters" / "small-mixed.yaml")


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_config_file_gives_the_options_and_flags_override_it(tmp_path, capsys, suffix):
    out = tmp_path / "out"
    if suffix == ".toml":
        text = (f'cluster = "{SMALL_MIXED}"\noutput = "{out}"\nno-emit = true\nquiet = true\n'
                "[set]\nlayers = 2\nfeatures = 12\nhidden = 16\nclasses = 5\nbatch = 4\n")
    else:
        text = (f"cluster: {SMALL_MIXED}\noutput: {out}\nno_emit: true\nquiet: true\n"
                "set: {layers: 2, features: 12, hidden: 16, classes: 5, batch: 4}\n")
    config = tmp_path / f"c{suffix}"
    config.write_text(text)
    assert main(["compile", MLP, "--config", str(config), "--set", "batch=8", "--no-trace-cache"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"]["kwargs"] == {"layers": 2, "features": 12, "hidden": 16, "classes": 5, "batch": 8}
    assert not (out / "program.py").exists()


@pytest.mark.parametrize("text, message", [
    ('clustr = "x"\n', r"clustr: not an option of this command; expected one of cluster, "),
    ('cluster = "x"\ntime-budget = "soon"\n', r"time-budget: expected float, got 'soon'"),
    ('cluster = "x"\nschedule = "zigzag"\n', r"schedule: expected one of 1f1b, gpipe, got 'zigzag'"),
    ('cluster = "x"\nno-emit = "yes"\n', r"no-emit: expected true or false"),
    ("cluster = \n", r"not valid TOML"),
    ('output = "o"\n', r"--cluster CLUSTER.yaml is required \(on the command line or as cluster in --config\)"),
])
def test_a_wrong_config_is_one_line(tmp_path, capsys, text, message):
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert main(["compile", MLP, "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and __import__("re").search(message, err), err
