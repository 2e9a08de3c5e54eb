"""hapc.frontend.cache.child: a cold compile traces in a child forked before torch is imported. The child's
graph, strategies and cache entry are a fresh trace's; a model error comes back as the same one
line; a child that fails otherwise is not trusted (the trace runs here); what the model prints
is not lost; a child is never left behind. The end-to-end cases run ``hapc compile`` in fresh
processes (the fork happens only where torch is not imported yet) against ``HAPC_SERIAL=1``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hapc.api import synthesize
from hapc.cli import main
from hapc.errors import UserError
from hapc.process.fork import spare_core
from hapc.frontend.modelfile import load_and_trace
from hapc.frontend.cache.keys import TraceKey
from hapc.frontend.cache.store import TraceCache
from hapc.frontend.cache.child import ChildTrace, TraceChild

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "configs" / "models" / "mlp.py")
GPT = str(ROOT / "configs" / "models" / "gpt.py")
SMALL_MIXED = str(ROOT / "configs" / "clusters" / "small-mixed.yaml")
MLP_SETTINGS = {"layers": 2, "features": 12, "hidden": 16, "classes": 5, "batch": 4}
MLP_SET = [x for k, v in MLP_SETTINGS.items() for x in ("--set", f"{k}={v}")]

# Without a spare core (or with HAPC_SERIAL) TraceChild runs its jobs here: the results must be
# the same, and the cases about the child itself are skipped.
FORKS = spare_core()
needs_a_child = pytest.mark.skipif(not FORKS, reason="no spare core or no fork: nothing is forked")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _mlp_trace():
    return load_and_trace(MLP, dict(MLP_SETTINGS))


@needs_a_child
def test_the_childs_graph_strategies_and_entry_are_a_fresh_traces(tmp_path):
    here = _mlp_trace()
    notes: list[str] = []
    cache = TraceCache(tmp_path / "cache", note=notes.append)
    key = TraceKey.for_model_file(MLP, MLP_SETTINGS)
    with TraceChild(_mlp_trace, "fp32", cache, key) as child:
        assert child._jobs.forked
        traced = child.traced()
        assert isinstance(traced, ChildTrace) and not traced.from_cache
        assert traced.graph == here.graph
        plan = synthesize(traced, None, SMALL_MIXED)
        assert traced.strategies_installed            # from the child, not from the rules
        entry = child.path()
    assert plan.to_dict() == synthesize(here, None, SMALL_MIXED).to_dict()
    hit = cache.lookup(key)
    assert entry is not None and hit is not None, notes
    assert hit.entry == entry and hit.graph == here.graph
    assert hit.install_strategies(traced.graph, "fp32")
    assert not child._scratch.exists()


@needs_a_child
def test_a_model_error_comes_back_as_the_same_one_line_error(tmp_path):
    def bad():
        raise UserError("syntax error at line 3: invalid syntax", where="model.py")

    with TraceChild(bad, "fp32", TraceCache(tmp_path), None) as child:
        pid = child._jobs.pid
        with pytest.raises(UserError) as raised:
            child.traced()
        assert child.path() is None
    assert str(raised.value) == "model.py: syntax error at line 3: invalid syntax"
    assert not _alive(pid)


def test_a_child_that_fails_otherwise_is_not_trusted_the_trace_runs_here(tmp_path):
    parent = os.getpid()

    def flaky():
        if os.getpid() != parent:
            os._exit(3)                   # dies without a word: a crash, the OOM killer
        return _mlp_trace()

    cache = TraceCache(tmp_path)
    key = TraceKey.for_model_file(MLP, MLP_SETTINGS)
    with TraceChild(flaky, "fp32", cache, key) as child:
        assert child.traced().graph == _mlp_trace().graph
        assert child.path() is not None           # written here, as the serial path does

    def broken():
        raise RuntimeError("a bug of ours")

    with TraceChild(broken, "fp32", cache, None) as child, pytest.raises(RuntimeError, match="a bug of ours"):
        child.traced()                            # raised here, as it would be without a child


def test_a_graph_that_does_not_read_back_equal_is_traced_here(tmp_path, monkeypatch):
    import hapc.frontend.cache.child

    monkeypatch.setattr(hapc.frontend.cache.child, "load_ir", lambda blob: None)     # in the child too
    with TraceChild(_mlp_trace, "fp32", TraceCache(tmp_path), None) as child:
        traced = child.traced()
    assert not isinstance(traced, ChildTrace) and traced.graph == _mlp_trace().graph


def test_the_childs_notes_are_passed_on_here(tmp_path):
    (tmp_path / "a-file").write_text("")
    notes: list[str] = []
    cache = TraceCache(tmp_path / "a-file", note=notes.append)          # cannot be a directory
    with TraceChild(_mlp_trace, "fp32", cache, TraceKey.for_model_file(MLP, MLP_SETTINGS)) as child:
        child.traced()
        assert notes == []                        # the entry is written while this one plans
        assert child.path() is None
    assert len(notes) == 1 and "not writable" in notes[0], notes


def test_what_the_model_prints_in_the_child_is_not_lost(tmp_path, capfd):
    def printing():
        print("model says hello")
        return _mlp_trace()

    with TraceChild(printing, "fp32", None, None) as child:
        child.traced()
        assert child.path() is None               # no cache: nothing stored
    assert capfd.readouterr().out.count("model says hello") == 1


@needs_a_child
def test_close_stops_a_child_that_still_works(tmp_path):
    with TraceChild(lambda: time.sleep(60), "fp32", TraceCache(tmp_path), None) as child:
        pid = child._jobs.pid
    assert pid and not _alive(pid) and not child._scratch.exists()


@needs_a_child
def test_after_ctrl_c_the_child_stops_what_it_started_itself(tmp_path):
    """A Ctrl-C reaches the child too; it is given a moment to stop (and reap) the short trace it
    runs beside itself before it is killed, so nothing is left to the init process."""
    started = tmp_path / "grandchild"

    def trace():
        from hapc.process.fork import Beside

        beside = Beside(lambda: time.sleep(60))
        started.write_text(str(beside.pid))
        try:
            return beside.result()
        except BaseException:
            beside.cancel()               # as hapc.frontend.blocktrace.trace_repeated does
            raise

    child = TraceChild(trace, "fp32", None, None)
    while not started.exists() or not started.read_text():
        time.sleep(0.01)
    grandchild = int(started.read_text())
    try:
        os.kill(child._jobs.pid, signal.SIGINT)         # what the terminal sends the whole group
        child.close(interrupted=True)
        assert not _alive(grandchild)
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _compile(out: Path, cache: Path, *extra: str, serial: bool = False, model: str = MLP,
             sets: list[str] = MLP_SET) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HAPC_SERIAL"}
    env.update(HAPC_CACHE_DIR=str(cache), **({"HAPC_SERIAL": "1"} if serial else {}))
    return subprocess.run([sys.executable, "-m", "hapc.cli", "compile", model, "--cluster", SMALL_MIXED,
                           "-o", str(out), *sets, *extra], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


@needs_a_child
def test_a_cold_compile_in_a_child_writes_what_a_serial_one_and_a_warm_one_do(tmp_path, monkeypatch):
    forked = _compile(tmp_path / "forked", tmp_path / "cache", "-q")
    warm = _compile(tmp_path / "warm", tmp_path / "cache", "-q")
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache-serial"))
    assert "torch" in sys.modules                 # so this one traces here
    assert main(["compile", MLP, "--cluster", SMALL_MIXED, "-o", str(tmp_path / "serial"), "-q", *MLP_SET]) == 0
    for run in (forked, warm):
        assert run.returncode == 0 and run.stderr == "", run.stderr
    for name in ("plan.json", "program.py", "report.md"):
        assert (tmp_path / "forked" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes(), name
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes(), name
    assert len(list((tmp_path / "cache").glob("*.strategies-fp32.json"))) == 1


def test_an_error_after_the_trace_still_keeps_the_cache_entry(tmp_path, monkeypatch, capsys):
    """The entry is written while the command plans; a mistake found then (here in-process, as
    a notebook or test runs it; in a fresh process the child writes it) lets the writer finish,
    so the corrected compile finds the trace."""
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    args = ["compile", MLP, "--cluster", SMALL_MIXED, "-o", str(tmp_path / "o"), "-q", *MLP_SET]
    assert main(args + ["--stages", "2", "--microbatches", "1000"]) == 2
    assert "more than the batch" in capsys.readouterr().err
    assert len(list((tmp_path / "cache").glob("*.trace"))) == 1


@needs_a_child
def test_a_bad_cluster_file_stops_the_child_at_once(tmp_path):
    """The cluster loads while the child imports torch: its error is the command's one line,
    and the child (and anything it started) is gone when the command ends."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - devices: [{type: NoSuchGPU, count: 2}]\n")
    env = {k: v for k, v in os.environ.items() if k != "HAPC_SERIAL"}
    proc = subprocess.Popen([sys.executable, "-m", "hapc.cli", "compile", MLP, "--cluster", str(bad),
                             "-o", str(tmp_path / "o"), *MLP_SET], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=dict(env, HAPC_CACHE_DIR=str(tmp_path / "cache")),
                            start_new_session=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "NoSuchGPU" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)                   # no process of its session is left
    assert not list((tmp_path / "cache").glob("*.trace"))


BAD_MODELS = {
    "syntax": "import torch\ndef model(:\n",
    "no-scalar": ("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
                  "def model(): return M()\ndef inputs(): return (torch.ones(3),)\n"),
    "data-dependent": ("import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n"
                       "        super().__init__(); self.w = torch.nn.Linear(3, 3)\n"
                       "    def forward(self, x):\n        y = self.w(x)\n"
                       "        return y.sum() if y.sum() > 0 else -y.sum()\n"
                       "def model(): return M()\ndef inputs(): return (torch.ones(2, 3),)\n"),
    "bad-set": ("import torch\ndef model(width=3): return torch.nn.Linear(width, 1)\n"
                "def inputs(width=3): return (torch.ones(2, width),)\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_model_errors_read_as_without_a_child(tmp_path, case):
    model = tmp_path / "model.py"
    model.write_text(BAD_MODELS[case])
    sets = ["--set", "depth=2"] if case == "bad-set" else []
    forked = _compile(tmp_path / "a", tmp_path / "cache-a", model=str(model), sets=sets)
    serial = _compile(tmp_path / "b", tmp_path / "cache-b", model=str(model), sets=sets, serial=True)
    assert forked.returncode == serial.returncode
    assert forked.stderr == serial.stderr and "Traceback" not in forked.stderr
    if case != "data-dependent":          # traced on real tensors after the meta trace fails
        assert forked.returncode == 2 and len(forked.stderr.strip().splitlines()) == 1, forked.stderr


@pytest.mark.slow
@needs_a_child
def test_ctrl_c_leaves_no_process_behind(tmp_path):
    """SIGINT to the command's process group (what a terminal sends) while the child imports
    torch and traces: the command says it was interrupted, and every process of it is gone."""
    env = dict(os.environ, HAPC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("HAPC_SERIAL", None)
    gpt = [x for k, v in {"layers": 24, "hidden": 256, "heads": 4, "seq": 64, "batch": 8, "vocab": 512}.items()
           for x in ("--set", f"{k}={v}")]
    proc = subprocess.Popen([sys.executable, "-m", "hapc.cli", "compile", GPT, "--cluster", SMALL_MIXED,
                             "-o", str(tmp_path / "o"), "-q", *gpt], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a process of the interrupted compile is still running")
