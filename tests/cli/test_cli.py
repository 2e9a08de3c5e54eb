"""The command line: user mistakes give one line and exit 2 (never a traceback), `hapc check`
exits 1 on a worse plan, every command has --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hapc
from hapc.cli import main

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "configs" / "models" / "mlp.py")
SMALL_MIXED = str(ROOT / "configs" / "clusters" / "small-mixed.yaml")
MLP_SMALL = ["--set", "layers=3", "--set", "features=20", "--set", "hidden=64", "--set", "classes=7",
             "--set", "batch=5"]


def _run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize("content, needle", [
    ("nodes:\n  - devices: [{type: NoSuchGPU, count: 2}]\n", "NoSuchGPU"),
    ("nodes: [\n", "YAML"),
    ("nodes: []\n", "nodes"),
    ("nodes:\n  - devices: [{type: A100-40GB, count: -1}]\n", "count"),
])
def test_bad_cluster_is_one_line_exit_2(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    rc, text = _run(["compile", MLP, "--cluster", str(bad), "-o", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert "Traceback" not in text
    assert len(text.strip().splitlines()) == 1
    assert "bad.yaml" in text and needle.lower() in text.lower()


def test_missing_files_are_one_line_exit_2(tmp_path, capsys):
    rc, text = _run(["compile", MLP, "--cluster", str(tmp_path / "nope.yaml")], capsys)
    assert rc == 2 and "nope.yaml" in text and len(text.strip().splitlines()) == 1
    rc, text = _run(["compile", str(tmp_path / "nomodel.py"), "--cluster", SMALL_MIXED], capsys)
    assert rc == 2 and "nomodel.py" in text
    rc, text = _run(["simulate", str(tmp_path / "plan.json")], capsys)
    assert rc == 2 and "plan.json" in text


def test_model_file_without_model_function(tmp_path, capsys):
    f = tmp_path / "empty.py"
    f.write_text("import torch\n")
    rc, text = _run(["compile", str(f), "--cluster", SMALL_MIXED, "-o", str(tmp_path / "o")], capsys)
    assert rc == 2 and "model()" in text and "Traceback" not in text


def test_model_that_does_not_trace_names_the_problem(tmp_path, capsys):
    f = tmp_path / "bad_model.py"
    f.write_text("import torch\n"
                 "class M(torch.nn.Module):\n"
                 "    def forward(self, x):\n"
                 "        return x * 2\n"
                 "def model(): return M()\n"
                 "def inputs(): return (torch.ones(3),)\n")
    rc, text = _run(["compile", str(f), "--cluster", SMALL_MIXED, "-o", str(tmp_path / "o")], capsys)
    assert rc == 2 and "scalar loss" in text


def test_compile_simulate_explain_check(tmp_path, capsys):
    out = tmp_path / "out"
    rc, text = _run(["compile", MLP, "--cluster", SMALL_MIXED, "-o", str(out), "--no-emit"] + MLP_SMALL,
                    capsys)
    assert rc == 0, text
    assert "predicted time per iteration" in text and "dp-even" in text
    assert (out / "plan.json").exists() and (out / "report.md").exists()
    rc, text = _run(["simulate", str(out / "plan.json"), "--cluster", str(ROOT / "configs/clusters/cpu4.yaml")],
                    capsys)
    assert rc == 0 and "time per iteration" in text
    rc, text = _run(["explain", str(out / "plan.json")], capsys)
    assert rc == 0 and "mlp.py:" in text
    assert "memory per device: what makes up each one's peak" in text and "params    grads    optim" in text
    rc, text = _run(["check", str(out / "plan.json"), "--baseline", str(out / "plan.json")], capsys)
    assert rc == 0 and "ok" in text


def test_check_fails_on_a_worse_plan(tmp_path, capsys):
    from hapc.frontend.modelfile import load_model_file

    model_file = load_model_file(MLP, {"layers": 3, "features": 20, "hidden": 64, "classes": 7, "batch": 5})
    model, inputs = model_file.build_model(), model_file.build_inputs()
    good = hapc.synthesize(model, inputs, SMALL_MIXED)
    worse = hapc.baseline(model, inputs, SMALL_MIXED, "zero3")
    assert worse.cost > good.cost * 1.02
    good.save(tmp_path / "golden.json")
    worse.save(tmp_path / "new.json")
    rc, text = _run(["check", str(tmp_path / "new.json"), "--baseline", str(tmp_path / "golden.json")], capsys)
    assert rc == 1 and "FAILED" in text
    rc, _ = _run(["check", str(tmp_path / "new.json"), "--baseline", str(tmp_path / "golden.json"),
                  "--tolerance", "100"], capsys)
    assert rc == 0


def test_ir_lists_flops_layouts_and_sources(capsys):
    rc, text = _run(["ir", MLP] + MLP_SMALL, capsys)
    assert rc == 0
    assert "rule coverage" in text and "aten.linear.default" in text and "mlp.py:" in text
    assert "S(0)" in text and "fwd" in text


@pytest.mark.parametrize("command", ["compile", "simulate", "explain", "check", "ir", "rules"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_console_script_exit_code_for_user_error(tmp_path):
    hapc_bin = Path(sys.executable).parent / "hapc"
    proc = subprocess.run([str(hapc_bin), "simulate", str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_a_compile_freezes_the_heap_as_the_interpreter_exits(tmp_path):
    """As replan does (tests/elastic/test_replan_reuse.py): the interpreter's last collection would walk
    everything the compile made and find no garbage, so hapc compile freezes the heap at exit.
    An earlier atexit handler runs later, after the freeze, and sees it."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "from hapc.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    args = ["compile", MLP, "--cluster", SMALL_MIXED, "-o", str(tmp_path / "out"), "-q", "--no-emit",
            "--no-trace-cache", *MLP_SMALL]
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1] == "frozen True", proc.stdout + proc.stderr[-2000:]


def test_an_output_that_cannot_be_written_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """A full disk while writing: exit 2, one line naming the folder, and the folder this
    compile made is gone (no half-written plan for a later run to pick up)."""
    from hapc.plan.plan import Plan

    def disk_full(self, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(Plan, "save", disk_full)
    out = tmp_path / "new" / "out"
    assert main(["compile", MLP, "--cluster", SMALL_MIXED, "-q", "--no-trace-cache", "-o", str(out), *MLP_SMALL]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"hapc: {out}: cannot write the output (No space left on device: {out / 'plan.json'})"
    assert not out.exists()


def test_an_output_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    assert main(["compile", MLP, "--cluster", SMALL_MIXED, "-q", "--no-trace-cache", "-o", str(out), *MLP_SMALL]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"hapc: {out}: cannot write the output")


def test_no_plan_in_memory_names_the_levers_to_try(tmp_path, capsys):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("nodes:\n  - devices: [{name: tiny, tflops: 1, memory_GB: 0.00001, hbm_GBps: 10, count: 2}]\n"
                    "    intra_link: loopback\n")
    assert main(["compile", MLP, "--cluster", str(tiny), "-q", "--no-trace-cache", "-o", str(tmp_path / "o"),
                 *MLP_SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit" in err and "GB missing on tiny#0" in err
    assert err.endswith("; to try: pipeline stages over device groups (--stages auto), bf16 activations "
                        "(--precision bf16), a smaller batch (--set batch=N, if the model file takes it), "
                        "a cluster with more memory")


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"hapc {hapc.__version__}"


def test_set_without_equals_shows_the_form(capsys):
    with pytest.raises(SystemExit) as done:
        main(["compile", MLP, "--cluster", SMALL_MIXED, "--set", "layers", "2"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "argument --set: expected KEY=VALUE, e.g. --set layers=2 (got 'layers')" in err


def test_baseline_takes_a_model_file_as_synthesize_does(tmp_path, monkeypatch):
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    kwargs = {"layers": 2, "features": 12, "hidden": 16, "classes": 5, "batch": 4}
    plan = hapc.baseline(MLP, None, SMALL_MIXED, "dp-even", model_kwargs=kwargs)
    assert plan.name == "dp-even" and plan.model["file"] == MLP and plan.model["kwargs"] == kwargs
    assert plan.cost == hapc.synthesize(MLP, None, SMALL_MIXED, model_kwargs=kwargs).baselines["dp-even"]


def test_check_names_the_settings_that_differ(tmp_path, capsys):
    golden = ROOT / "tests" / "golden" / "gpt-small-mixed.json"
    sets = ["--set", "layers=2", "--set", "hidden=64", "--set", "heads=4", "--set", "seq=16", "--set", "vocab=101",
            "--set", "batch=5"]          # no dropout=0.0: the golden's graph has none
    assert main(["compile", str(ROOT / "configs" / "models" / "gpt.py"), "--cluster", SMALL_MIXED, "-q",
                 "--no-emit", "--no-trace-cache", "-o", str(tmp_path / "o"), *sets]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "o" / "plan.json"), "--baseline", str(golden)]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("hapc check: the plans are for different graphs (")
    assert out.endswith(": dropout is the model file's default here, 0.0 in the golden")


def test_rules_check_one_op_with_progress(capsys):
    assert main(["rules", "--check", "--op", "mm"]) == 0
    captured = capsys.readouterr()
    assert "checking rule 1/1: aten.mm.default" in captured.err
    assert captured.out.strip().endswith("1 ops with rules, 1 samples, 6 strategies checked: 0 wrong, 0 without samples")
    assert main(["rules", "--check", "--op", "nosuchop"]) == 2
    assert capsys.readouterr().err.strip() == "hapc rules: no rule for an op named 'nosuchop'; hapc rules lists them"
    assert main(["rules", "--op", "mm"]) == 2
    assert "add --check" in capsys.readouterr().err


def test_ir_summary_on_the_meta_device(capsys):
    assert main(["ir", MLP, "--meta", "--summary", *MLP_SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("graph ") and out[3].split() == ["op", "nodes", "fwd", "FLOPs", "bwd", "FLOPs", "rule"]
    assert any(line.startswith("aten.linear.default") and line.rstrip().endswith("yes") for line in out[4:])


def test_quiet_compile_prints_what_it_wrote_and_how_to_run_it(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", MLP, "--cluster", SMALL_MIXED, "-o", str(out), "-q", "--no-trace-cache", *MLP_SMALL]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"wrote {out / 'plan.json'}, ") and lines[1].startswith("run it: ")
    assert captured.err == ""
