"""``hapc replan`` reuses what the compile derived (issue 15's <= 1 s replan).

The cache beside plan.json (synth.reuse) holds every node's candidate strategies, so a replan
never calls the sharding rules, which import torch: the round trip gives exactly the rules'
strategies, a stale or corrupt cache is refused in one line (and the CLI then derives them
again, saying so), a replan on the cache imports neither torch, scipy.optimize nor matplotlib,
and its plan is as fast as a fresh synthesis on the new cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_codegen import SMALL_MIXED  # noqa: E402

from costmodel.cluster import load_cluster  # noqa: E402
from hapc.cli import main as cli_main  # noqa: E402
from hapc.plan import Plan  # noqa: E402
from synth import reuse  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """``hapc compile`` of the SMALL MLP on the 4-device small mixed cluster: plan.json and its
    replan cache (no program: the replans below test planning)."""
    out = tmp_path_factory.mktemp("compiled")
    model = REPO / "configs" / "models" / "mlp.py"
    spec = importlib.util.spec_from_file_location("mlp_model_file", model)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["compile", str(model), "--cluster", str(SMALL_MIXED), "-o", str(out), "-q", "--no-emit"]
    for key, value in module.SMALL.items():
        args += ["--set", f"{key}={value}"]
    assert cli_main(args) == 0
    return out


def test_compile_writes_a_cache_that_gives_the_rules_strategies(compiled):
    from hapc.rules.registry import strategies

    assert (compiled / reuse.FILE_NAME).exists()
    plan = Plan.load(compiled / "plan.json")         # a new graph object: nothing derived for it yet
    distinct = reuse.load(plan.graph, compiled / reuse.FILE_NAME)
    assert 0 < distinct < len(plan.graph.nodes)       # repeated layers share their lists
    from synth.space import node_strategies

    for node in plan.graph.nodes:
        assert node_strategies(plan.graph, node) == strategies(node, plan.graph), node.name


def _corrupt(path: Path, how: str) -> None:
    data = json.loads(path.read_text())
    if how == "truncated":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
        return
    if how == "format":
        data["format"] = "hapc-replan-cache/0"
    elif how == "graph":
        data["graph"] = "0" * 32
    elif how == "layout":
        strategy = next(s for options in data["strategies"] for s in options if s[0])
        strategy[0][0] = "S(x)"
    elif how == "count":
        data["node_strategies"].pop()
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("how, message", [
    ("truncated", "unreadable replan cache"), ("format", "replan cache format 'hapc-replan-cache/0'"),
    ("graph", "replan cache of another graph"), ("layout", "corrupt replan cache entry"),
    ("count", "node entries for a graph of"), ("missing", "no replan cache"),
])
def test_a_stale_or_corrupt_cache_is_refused_in_one_line(compiled, tmp_path, how, message):
    path = tmp_path / reuse.FILE_NAME
    if how != "missing":
        path.write_text((compiled / reuse.FILE_NAME).read_text())
        _corrupt(path, how)
    plan = Plan.load(compiled / "plan.json")
    with pytest.raises(reuse.StaleCache) as exc:
        reuse.load(plan.graph, path)
    text = str(exc.value)
    assert message in text and str(path) in text and "\n" not in text


def test_replan_with_a_stale_cache_derives_the_strategies_and_says_so(compiled, tmp_path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    (old / "plan.json").write_text((compiled / "plan.json").read_text())
    (old / reuse.FILE_NAME).write_text("{not json")
    out = tmp_path / "new"
    assert cli_main(["replan", str(old / "plan.json"), "--drop", "1", "--search", "-o", str(out), "--no-emit"]) == 0
    assert "unreadable replan cache" in capsys.readouterr().err
    # The search derived the strategies, so the new plan gets a good cache for the next replan.
    new = Plan.load(out / "plan.json")
    assert reuse.load(new.graph, out / reuse.FILE_NAME) > 0


def test_a_replan_on_the_cache_imports_no_torch_scipy_optimize_or_matplotlib(compiled, tmp_path):
    """The modules that made a replan take seconds: the sharding rules' torch, scipy's LP and
    the chart (now an SVG written as text). (A fresh interpreter: this process has them all.)"""
    out = tmp_path / "new"
    code = ("import sys; from hapc.cli import main; "
            f"rc = main(['replan', {str(compiled / 'plan.json')!r}, '--drop', '1', '--search', '-o', {str(out)!r}, "
            "'--no-emit', '-q']); "
            "print(rc, sorted(m for m in ('torch', 'scipy.optimize', 'matplotlib') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout[-2000:]
    carried, cache = (json.loads((d / reuse.FILE_NAME).read_text()) for d in (out, compiled))
    assert carried.pop("plan_sha256") == reuse.plan_digest(out / "plan.json")     # chains, stamped anew
    assert cache.pop("plan_sha256") == reuse.plan_digest(compiled / "plan.json") and carried == cache
    assert (out / "report.md").exists()


def test_replan_after_a_drop_is_as_fast_as_a_fresh_synthesis(compiled):
    """The replanned plan (one search round from the old plan, re-balanced by the LP) against
    hapc compile's whole loop on the new cluster, both under the simulator: equal here, and
    never more than REPLAN_GAP slower (the stated bound)."""
    from costmodel.cluster_edit import surviving_ranks, without_devices
    from hapc.replan import replan
    from synth.synthesize import synthesize_program

    old = Plan.load(compiled / "plan.json")
    reuse.load(old.graph, compiled / reuse.FILE_NAME)
    new_cluster = without_devices(load_cluster(SMALL_MIXED), [1])
    done = replan(old, new_cluster, survivors=surviving_ranks(old.cluster.world, [1]), effort="search")
    fresh = synthesize_program(old.graph, new_cluster).best
    assert done.plan.fits and done.plan.cluster.world == 3
    assert done.plan.cost <= fresh.seconds * (1 + REPLAN_GAP), (done.plan.cost, fresh.seconds)


REPLAN_GAP = 0.02


# ---- the second search in a forked child (hapc.forked) -------------------------------------------

def test_a_job_beside_runs_in_a_child_and_returns_its_value():
    from hapc.forked import Beside, spare_core

    if not spare_core():
        pytest.skip("one core (or HAPC_SERIAL): jobs run in this process")
    parent = os.getpid()
    got = Beside(lambda: (os.getpid(), [1.5, {"x": (2, 3)}])).result()
    assert got[0] != parent and got[1] == [1.5, {"x": (2, 3)}]


def test_a_job_beside_runs_here_when_serial_and_its_errors_surface_here(monkeypatch):
    from hapc.forked import Beside

    def fails():
        raise ValueError(f"raised in {os.getpid()}")

    with pytest.raises(ValueError, match=f"raised in {os.getpid()}"):     # run again here, the error seen here
        Beside(fails).result()
    monkeypatch.setenv("HAPC_SERIAL", "1")
    assert Beside(os.getpid).result() == os.getpid()


def test_a_job_beside_that_is_not_wanted_is_stopped_and_reaped():
    import time

    from hapc.forked import Beside, spare_core

    if not spare_core():
        pytest.skip("one core (or HAPC_SERIAL): nothing runs until asked")
    job = Beside(lambda: time.sleep(60))
    pid = job._each._pid
    started = time.perf_counter()
    job.cancel()
    assert time.perf_counter() - started < 10
    with pytest.raises(ChildProcessError):        # reaped: no zombie left behind
        os.waitpid(pid, 0)


def test_a_job_beside_says_when_its_result_is_ready():
    import time

    from hapc.forked import Beside, spare_core

    if not spare_core():
        pytest.skip("one core (or HAPC_SERIAL): nothing runs until asked")
    job = Beside(lambda: time.sleep(0.5) or "done")
    assert job.forked and not job.ready()          # the child is still sleeping
    deadline = time.perf_counter() + 30
    while not job.ready() and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert job.ready() and job.result() == "done" and not job.forked
