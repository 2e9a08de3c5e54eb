"""plan.json names its model file relative to its own folder: a plan and its model move together
(another checkout, a CI golden, a colleague's machine) and still load, emit and resume; a plan
written with an absolute path (before this) loads as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hapc.cli import main
from hapc.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "configs" / "models" / "mlp.py"
SMALL_MIXED = str(ROOT / "configs" / "clusters" / "small-mixed.yaml")
SETS = ["--set", "layers=2", "--set", "features=12", "--set", "hidden=16", "--set", "batch=4"]


def _compiled(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    shutil.copy(MLP, project / "models" / "mlp.py")
    assert main(["compile", str(project / "models" / "mlp.py"), "--cluster", SMALL_MIXED, "-q", "--no-emit",
                 "-o", str(project / "out"), *SETS]) == 0
    return project


def test_the_model_file_is_stored_relative_to_the_plan(tmp_path):
    project = _compiled(tmp_path)
    data = json.loads((project / "out" / "plan.json").read_text())
    assert data["model"]["file"] == "../models/mlp.py"
    assert str(tmp_path) not in json.dumps(data["model"])
    assert Plan.load(project / "out" / "plan.json").model["file"] == str(project / "models" / "mlp.py")


def test_a_moved_plan_finds_its_model_and_emits(tmp_path, capsys):
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(_compiled(tmp_path), moved)
    shutil.rmtree(tmp_path / "project")
    plan = Plan.load(moved / "out" / "plan.json")
    assert plan.model["file"] == str(moved / "models" / "mlp.py")
    program = plan.emit(moved / "emitted")
    assert program.exists() and (moved / "emitted" / "mlp.py").read_text() == MLP.read_text()


def test_an_absolute_model_path_loads_unchanged(tmp_path):
    project = _compiled(tmp_path)
    path = project / "out" / "plan.json"
    data = json.loads(path.read_text())
    data["model"]["file"] = str(project / "models" / "mlp.py")
    path.write_text(json.dumps(data))
    assert Plan.load(path).model["file"] == str(project / "models" / "mlp.py")


def test_a_model_with_only_the_root_in_common_keeps_its_absolute_path():
    from hapc.plan.paths import loaded_model_path, stored_model_path

    assert stored_model_path("/work/repo/models/mlp.py", Path("/tmp/out/plan.json")) == "/work/repo/models/mlp.py"
    assert stored_model_path("/work/repo/models/mlp.py", Path("/work/out/plan.json")) == "../repo/models/mlp.py"
    assert loaded_model_path("../repo/models/mlp.py", "/work/out/plan.json") == "/work/repo/models/mlp.py"
