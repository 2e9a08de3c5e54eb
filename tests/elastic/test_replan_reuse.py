"""``hapc replan`` reuses what the compile derived (issue 15's <= 1 s replan).

The cache beside plan.json (synth.reuse) holds every node's candidate strategies, so a replan
never calls the sharding rules, which import torch: the round trip gives exactly the rules'
strategies, a stale or corrupt cache is refused in one line (and the CLI then derives them
again, saying so), a replan on the cache imports neither torch nor scipy.optimize,
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


from tests.runs import SMALL_MIXED  # noqa: E402

from costmodel.cluster import load_cluster  # noqa: E402
from hapc.cli import main as cli_main  # noqa: E402
from hapc.plan.plan import Plan  # noqa: E402
from synth import reuse  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


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
    from hapc.elastic.replan import replan
    from synth.synthesize import synthesize_program

    old = Plan.load(compiled / "plan.json")
    reuse.load(old.graph, compiled / reuse.FILE_NAME)
    new_cluster = without_devices(load_cluster(SMALL_MIXED), [1])
    done = replan(old, new_cluster, survivors=surviving_ranks(old.cluster.world, [1]), effort="search")
    fresh = synthesize_program(old.graph, new_cluster).best
    assert done.plan.fits and done.plan.cluster.world == 3
    assert done.plan.cost <= fresh.seconds * (1 + REPLAN_GAP), (done.plan.cost, fresh.seconds)


REPLAN_GAP = 0.02


# ---- the cache's stamp: plan.json's bytes stand for its graph -------------------------------

def _counting_fingerprints(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = reuse.graph_fingerprint
    monkeypatch.setattr(reuse, "graph_fingerprint", lambda graph: calls.append(1) or real(graph))
    return calls


def test_a_cache_stamped_for_the_plan_file_is_not_fingerprinted_again(compiled, monkeypatch):
    cache = json.loads((compiled / reuse.FILE_NAME).read_text())
    assert cache["plan_sha256"] == reuse.plan_digest(compiled / "plan.json")
    calls = _counting_fingerprints(monkeypatch)
    plan = Plan.load(compiled / "plan.json")
    assert reuse.load(plan.graph, compiled / reuse.FILE_NAME, plan_sha256=reuse.plan_digest(compiled / "plan.json"))
    assert calls == []
    plan = Plan.load(compiled / "plan.json")
    assert reuse.load(plan.graph, compiled / reuse.FILE_NAME, plan_sha256="0" * 64)   # another file: checked
    assert calls == [1]


def test_a_stamp_that_misses_falls_back_to_the_fingerprint_never_to_a_stale_cache(compiled, tmp_path, capsys):
    """An edited plan.json (other bytes) keeps a cache whose fingerprint matches its graph and
    refuses one of another graph, also when the cache's stamp was the plan's before the edit."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "plan.json").write_text((compiled / "plan.json").read_text() + "\n")        # same graph, other bytes
    cache = json.loads((compiled / reuse.FILE_NAME).read_text())
    (old / reuse.FILE_NAME).write_text(json.dumps(cache))
    plan = Plan.load(old / "plan.json")
    assert reuse.load(plan.graph, old / reuse.FILE_NAME, plan_sha256=reuse.plan_digest(old / "plan.json")) > 0

    cache["graph"] = "0" * 32                       # the strategies of another graph...
    cache["plan_sha256"] = reuse.plan_digest(compiled / "plan.json")      # ...stamped for other bytes
    (old / reuse.FILE_NAME).write_text(json.dumps(cache))
    plan = Plan.load(old / "plan.json")
    with pytest.raises(reuse.StaleCache, match="replan cache of another graph"):
        reuse.load(plan.graph, old / reuse.FILE_NAME, plan_sha256=reuse.plan_digest(old / "plan.json"))
    out = tmp_path / "new"
    assert cli_main(["replan", str(old / "plan.json"), "--drop", "1", "--search", "-o", str(out), "--no-emit"]) == 0
    assert "replan cache of another graph" in capsys.readouterr().err          # derived from the rules instead
    written = json.loads((out / reuse.FILE_NAME).read_text())
    assert written["plan_sha256"] == reuse.plan_digest(out / "plan.json")
    assert written["graph"] == reuse.graph_fingerprint(Plan.load(out / "plan.json").graph)


def test_replan_imports_no_numpy_before_its_child_searches():
    """numpy (and the LP) are imported only for a re-balance the closed form cannot settle
    (hapc.elastic.replan._lp_tools): a module on replan's path that imports numpy at its top puts a fifth
    of a second back on every replan (see test_replan_waterfill for a whole replan)."""
    code = ("import sys, hapc.cli, hapc.elastic.replan, hapc.plan.plan, synth.reuse, costmodel.cluster_edit; "
            "print(sorted(m for m in ('numpy', 'highspy', 'scipy') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_replan_pauses_the_cyclic_collector_and_restores_it(compiled, tmp_path, monkeypatch):
    import gc

    import hapc.elastic.replan

    seen: list[bool] = []
    real = hapc.elastic.replan._replan
    monkeypatch.setattr(hapc.elastic.replan, "_replan", lambda *args: seen.append(gc.isenabled()) or real(*args))
    assert gc.isenabled()
    assert cli_main(["replan", str(compiled / "plan.json"), "--drop", "1", "--quick", "-o", str(tmp_path / "new"),
                     "--no-emit", "-q"]) == 0
    assert seen == [False] and gc.isenabled()


def test_prepare_save_hashes_a_loaded_graph_once_for_the_save_that_follows(compiled, tmp_path, monkeypatch):
    """hapc replan hashes the old graph for the new plan.json while its child searches
    (hapc.plan.plan.prepare_save); the save then finds the hash made and writes the same file."""
    import hapc.plan.plan

    hashed: list[int] = []
    real = hapc.plan.plan.hash_of_json
    monkeypatch.setattr(hapc.plan.plan, "hash_of_json", lambda data: hashed.append(1) or real(data))
    plan = Plan.load(compiled / "plan.json")
    hapc.plan.plan.prepare_save(plan.graph)
    assert hashed == [1]
    plan.save(tmp_path / "plan.json")
    assert hashed == [1]
    assert (tmp_path / "plan.json").read_bytes() == (compiled / "plan.json").read_bytes()


def test_a_replan_freezes_the_heap_as_the_interpreter_exits(compiled, tmp_path):
    """The interpreter's last collection would walk everything the replan made (17 ms of
    GPT-48's 0.25 s): hapc replan freezes the heap at exit (an atexit handler), so that pass is
    skipped. An earlier handler runs later, after the freeze, and sees it."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "from hapc.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    args = ["replan", str(compiled / "plan.json"), "--drop", "1", "--quick", "--no-emit", "-q",
            "-o", str(tmp_path / "new")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1] == "frozen True", proc.stdout + proc.stderr[-2000:]
