"""``hapc replan`` (issues 15, 18): cluster edits renumber and slow devices; a dropped device keeps
the old program on the rest (``--quick``) or searches when it degraded; bad changes are one line;
a replan after a lost device resumes the single-device loss curve from a checkpoint; measured
per-rank timings (``--timings``) make a straggler get less work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from costmodel.cluster import load_cluster
from hapc.cli import main as cli_main
from tests.runs import run_losses, single_device_run, torchrun

TOLERANCE = 1e-5


# ---- replan ------------------------------------------------------------------------------------

def _plan_file(directory: Path, model: str, plan: str) -> Path:
    """plan.json of a SMALL model's plan on the small mixed cluster (4 devices)."""
    from tests.runs import SMALL_MIXED, traced_small

    import hapc

    traced, path, small = traced_small(model)
    if plan == "synth":
        made = hapc.synthesize(traced, None, SMALL_MIXED, model_file=str(path), model_kwargs=small)
    else:
        made = hapc.baseline(traced, None, SMALL_MIXED, plan, model_file=str(path), model_kwargs=small)
    made.save(directory / "plan.json")
    return directory / "plan.json"


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    return _plan_file(tmp_path_factory.mktemp("old"), "mlp", "dp-flops")


def test_cluster_edits_renumber_ranks_and_slow_a_device():
    from costmodel.cluster_edit import slowed, surviving_ranks, without_devices

    eight = load_cluster(Path(__file__).resolve().parents[2] / "configs/clusters/hap-8gpu-v100x4-p100x4.yaml")
    seven = without_devices(eight, [1])
    assert seven.world == 7 and [d.index for d in seven.devices] == list(range(7))
    assert [len(n.devices) for n in seven.nodes] == [3, 4] and seven.devices[3].type == "P100-16GB"
    assert seven.devices[3].node == 1 and surviving_ranks(8, [1]) == [0, 2, 3, 4, 5, 6, 7, 8][:7]
    assert [len(n.devices) for n in without_devices(eight, [0, 1, 2, 3]).nodes] == [4]
    slow = slowed(eight, {5: 4.0})
    assert slow.devices[5].peak_flops["fp32"] == pytest.approx(eight.devices[5].peak_flops["fp32"] / 4)
    assert slow.devices[4] == eight.devices[4]


def test_replan_drop_quick_keeps_the_program_on_three_devices(small_plan, tmp_path, capsys):
    from hapc.plan.plan import Plan

    out = tmp_path / "new"
    assert cli_main(["replan", str(small_plan), "--drop", "1", "--quick", "-o", str(out), "-q", "--no-emit"]) == 0
    said = capsys.readouterr().out
    assert "replanned 4 -> 3 devices" in said and "the old program re-balanced" in said
    old, new = Plan.load(small_plan), Plan.load(out / "plan.json")
    assert new.cluster.world == 3 and new.search["replan"]["kept_program"] and new.search["replan"]["effort"] == "quick"
    assert [s.node for s in new.program.steps if hasattr(s, "node")] == \
        [s.node for s in old.program.steps if hasattr(s, "node")]


def test_replan_searches_by_default_only_when_the_old_program_degraded(small_plan, tmp_path, capsys, monkeypatch):
    import hapc.elastic.replan
    from hapc.plan.plan import Plan

    monkeypatch.setattr(hapc.elastic.replan, "DEGRADED", 10.0)      # nothing counts as degraded: no search
    assert cli_main(["replan", str(small_plan), "--drop", "2", "-o", str(tmp_path / "a"), "--no-emit"]) == 0
    assert "lost no more than the devices did" in capsys.readouterr().err
    assert Plan.load(tmp_path / "a" / "plan.json").search["replan"]["effort"] == "quick"


def test_replan_slow_moves_work_off_the_slowed_device(small_plan, tmp_path, capsys):
    from hapc.plan.plan import Plan

    out = tmp_path / "slow"
    assert cli_main(["replan", str(small_plan), "--slow", "0=8", "--quick", "-o", str(out), "-q", "--no-emit"]) == 0
    old, new = Plan.load(small_plan), Plan.load(out / "plan.json")
    assert new.cluster.world == 4 and new.ratios[0] < 0.75 * old.ratios[0] and new.ratios[0] == min(new.ratios)
    assert new.cluster.devices[0].peak_flops["fp32"] == pytest.approx(old.cluster.devices[0].peak_flops["fp32"] / 8)


@pytest.mark.parametrize("args, message", [
    (["--drop", "9"], "--drop 9: the cluster has ranks 0..3"),
    (["--slow", "1"], "--slow 1: expected RANK=FACTOR"),
    (["--slow", "1=0"], "--slow 1=0: the factor must be positive"),
    (["--drop", "0,1,2,3"], "--drop: that would leave no device"),
])
def test_replan_bad_changes_are_one_line_errors(small_plan, tmp_path, capsys, args, message):
    assert cli_main(["replan", str(small_plan), *args, "-o", str(tmp_path / "x"), "-q"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_replan_needs_a_change(small_plan, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["replan", str(small_plan), "-o", str(tmp_path / "x")])
    assert exc.value.code == 2 and "give the change" in capsys.readouterr().err


@pytest.mark.slow
def test_replan_after_a_lost_device_resumes_the_loss_curve(tmp_path, capsys):
    """The README demo as a test: 4 ranks, drop one, replan (one search; no worse than keeping
    the old program), resume on 3 from the checkpoint, continue one device's losses."""
    from hapc.plan.plan import Plan

    old_file = _plan_file(tmp_path, "gpt", "synth")
    old = Plan.load(old_file)
    old_program = old.emit(tmp_path / "old")
    new_dir, quick = tmp_path / "new", tmp_path / "quick"
    assert cli_main(["replan", str(old_file), "--drop", "3", "--search", "-o", str(new_dir), "-q"]) == 0
    assert cli_main(["replan", str(old_file), "--drop", "3", "--quick", "-o", str(quick), "-q", "--no-emit"]) == 0
    new = Plan.load(new_dir / "plan.json")
    assert new.search["replan"]["effort"] == "search" and new.cluster.world == 3
    assert "WORLD = 3" in (new_dir / "program.py").read_text() and (new_dir / "hapc_checkpoint.py").exists()
    assert new.cost <= Plan.load(quick / "plan.json").cost * (1 + 1e-9)
    ck = tmp_path / "ck"
    got = run_losses(torchrun(old_program, 4, "--steps", "2", "--save", str(ck)))
    got |= run_losses(torchrun(new_dir / "program.py", 3, "--steps", "2", "--load", str(ck)))
    losses, _ = single_device_run(old_program, 4)
    assert sorted(got) == [1, 2, 3, 4]
    assert max(abs(got[i + 1] - losses[i]) for i in range(4)) <= TOLERANCE, (got, losses)


# ---- straggler report --------------------------------------------------------------------------

def test_timings_split_blocked_time_into_comm_and_idle():
    from hapc.runtime.timings import split

    # Rank 1 computed 0.3 s longer: rank 0 idled that long of its 0.4 s blocked, the rest was comm.
    (c0, m0, i0), (c1, m1, i1) = split([1.0, 1.0], [0.4, 0.1])
    assert (c0, c1) == pytest.approx((0.6, 0.9)) and (i0, m0) == pytest.approx((0.3, 0.1))
    assert (i1, m1) == pytest.approx((0.0, 0.1))


def test_speeds_within_noise_count_as_equal_and_a_straggler_stands_out():
    from hapc.elastic.straggler import rank_speeds

    predicted = [0.1, 0.1, 0.1, 0.1]
    samples = {0: [0.100, 0.104, 0.098], 1: [0.150, 0.102, 0.130],    # identical devices, noisy
               2: [0.120, 0.101, 0.110], 3: [0.300, 0.310, 0.295]}   # rank 3 is three times slower
    speeds = rank_speeds(samples, predicted)
    assert speeds[0].group == speeds[1].group == speeds[2].group == (0, 1, 2)
    assert speeds[0].slowdown == speeds[1].slowdown == 1.0
    assert speeds[3].group == (3,) and speeds[3].slowdown == pytest.approx(0.300 / 0.104, rel=0.1)


def test_replan_measured_gives_the_straggler_less_work(small_plan, tmp_path, capsys):
    from hapc.plan.plan import Plan

    old = Plan.load(small_plan)
    log = tmp_path / "run.log"
    lines = []
    for step in range(1, 5):
        for r, predicted in enumerate(old.sim.compute_seconds):
            factor = 3.0 if r == 1 else 1.0 + 0.01 * ((step + r) % 3)
            lines.append(f"timing step {step} rank {r} compute_s {predicted * factor:.9f} comm_s 0 idle_s 0")
    log.write_text("step 1 loss 2.0 time 0.1\n" + "\n".join(lines) + "\n")
    out = tmp_path / "m"
    assert cli_main(["replan", str(small_plan), "--measured", str(log), "--quick", "-o", str(out), "--no-emit"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"ranks 1: 2\.9\dx slower", err) and "ranks 0,2,3: the fastest" in err
    new = Plan.load(out / "plan.json")
    assert new.ratios[1] < old.ratios[1] and new.ratios[1] == min(new.ratios)
    empty = tmp_path / "empty.log"
    empty.write_text("step 1 loss 2.0\n")
    assert cli_main(["replan", str(small_plan), "--measured", str(empty), "-o", str(out), "-q"]) == 2
    assert "run the program with --timings" in capsys.readouterr().err


@pytest.mark.slow
def test_timings_of_a_real_run_feed_replan_measured(tmp_path, capsys):
    """Four gloo ranks print per-rank timings; replan reads that log (on one loaded machine the
    ranks' speeds are whatever the scheduler gave them, so only the plumbing is asserted)."""
    from hapc.plan.plan import Plan

    plan_file = _plan_file(tmp_path, "mlp", "dp-flops")
    program = Plan.load(plan_file).emit(tmp_path / "prog")
    proc = torchrun(program, 4, "--steps", "4", "--timings")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("timing step ")]
    assert len(lines) == 16 and {ln.split()[4] for ln in lines} == {"0", "1", "2", "3"}
    for ln in lines:                 # compute + comm + idle are the rank's step, none negative
        assert all(float(x) >= 0 for x in ln.split()[6::2])
    log = tmp_path / "run.log"
    log.write_text(proc.stdout)
    out = tmp_path / "m"
    assert cli_main(["replan", str(plan_file), "--measured", str(log), "--quick", "-o", str(out), "--no-emit"]) == 0
    assert "the fastest" in capsys.readouterr().err
    assert Plan.load(out / "plan.json").cluster.world == 4
