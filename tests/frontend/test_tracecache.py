"""The trace cache (hapc.frontend.cache.store): a hit gives the graph a fresh trace gives; any change to
what decided the graph (the model file, a module or file it read, a setting, torch's version)
is a miss; a damaged entry is a miss with a note; a compile from the cache writes the same
plan and program; and a hit never imports torch._dynamo."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hapc.frontend.cache import keys as tracekeys
from hapc.cli import main
from hapc.frontend.modelfile import load_model_file
from hapc.frontend.cache.cached_trace import trace_model_file
from hapc.frontend.cache.store import CachedTrace, TraceCache

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "configs" / "models" / "mlp.py"
SMALL_MIXED = str(ROOT / "configs" / "clusters" / "small-mixed.yaml")
MLP_SMALL = ["--set", "layers=2", "--set", "features=12", "--set", "hidden=16", "--set", "classes=5",
             "--set", "batch=4"]

# A model that imports a helper module and reads a settings file, as real model files do.
MODEL = '''
import json, os
import torch
import tc_helper

def model(hidden=8):
    width = json.load(open(os.path.join(os.path.dirname(__file__), "settings.json")))["width"]
    return tc_helper.Net(width, hidden)

def inputs(hidden=8):
    return (torch.randn(3, 6), torch.randint(0, 4, (3,)))
'''
HELPER = '''
import torch

class Net(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.a = torch.nn.Linear(width, hidden)
        self.b = torch.nn.Linear(hidden, 4)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.b(torch.relu(self.a(x))), y)
'''


class Tracer:
    """``trace()`` for :func:`trace_model_file`, counting how often it really traced."""

    def __init__(self, path: Path, overrides: dict, device: str | None = "meta"):
        self.path, self.overrides, self.device, self.calls = path, overrides, device, 0

    def __call__(self):
        from hapc.frontend.tracer import trace

        self.calls += 1
        sys.modules.pop("tc_helper", None)      # as a fresh process would import it
        mf = load_model_file(str(self.path), self.overrides)
        return trace(mf.build_model(device=self.device), tuple(t.to(self.device or "cpu") for t in mf.build_inputs()))


def _through(cache: TraceCache, path: Path, overrides: dict | None = None, device: str | None = "meta"):
    tracer = Tracer(path, overrides or {}, device)
    traced, entry = trace_model_file(path, overrides or {}, tracer, cache=cache)
    return traced, tracer.calls


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A model folder and a cache holding its trace (traced once for the module's tests)."""
    d = tmp_path_factory.mktemp("tc") / "model"
    d.mkdir()
    files = {"net.py": MODEL, "tc_helper.py": HELPER, "settings.json": '{"width": 6}'}
    for name, text in files.items():
        (d / name).write_text(text)
    sys.path.insert(0, str(d))
    cache = d.parent / "cache"
    traced, calls = _through(TraceCache(cache), d / "net.py")
    assert calls == 1 and not isinstance(traced, CachedTrace)
    yield d, cache, traced.graph, files
    sys.path.remove(str(d))
    sys.modules.pop("tc_helper", None)


@pytest.fixture
def model_dir(filled, tmp_path):
    """The filled model folder, its files as written, and this test's copy of the cache."""
    d, cache, graph, files = filled
    shutil.copytree(cache, tmp_path / "cache")
    yield d, tmp_path / "cache", graph
    for name, text in files.items():
        if (d / name).read_text() != text:
            (d / name).write_text(text)
    # Modules of files this test edited would be stale in this process: a later store would
    # (rightly) refuse to stamp a trace while they are loaded.
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(d)):
            del sys.modules[name]


def test_hit_returns_an_equal_graph(model_dir):
    d, cache, graph = model_dir
    again, calls = _through(TraceCache(cache), d / "net.py")
    assert calls == 0 and isinstance(again, CachedTrace)
    assert again.graph == graph and again.graph.hash() == graph.hash()
    assert again.graph.to_dict() == graph.to_dict()       # costs and source lines too
    assert [repr(n) for n in again.graph.nodes] == [repr(n) for n in graph.nodes]


@pytest.mark.parametrize("change", ["model file", "imported module", "file it read", "setting", "torch version"])
def test_any_change_to_what_decided_the_graph_misses(model_dir, monkeypatch, change):
    d, cache_dir, _ = model_dir
    notes: list[str] = []
    cache = TraceCache(cache_dir, note=notes.append)
    overrides: dict = {}
    if change == "model file":
        (d / "net.py").write_text(MODEL + "\n# edited\n")
    elif change == "imported module":
        (d / "tc_helper.py").write_text(HELPER.replace("torch.relu", "torch.tanh"))
    elif change == "file it read":
        (d / "settings.json").write_text('{"width": 6} ')
    elif change == "setting":
        overrides = {"hidden": 9}
    else:
        monkeypatch.setattr(tracekeys, "torch_version", lambda: "0.0.0-other")
    traced, calls = _through(cache, d / "net.py", overrides)
    assert calls == 1, f"a changed {change} must not hit"
    if change in ("imported module", "file it read"):
        assert any("changed since the cached trace" in n for n in notes)
    _, calls = _through(cache, d / "net.py", overrides)
    assert calls == 0, notes   # the new trace was stored


def test_a_touched_but_unchanged_source_still_hits(model_dir):
    d, cache, _ = model_dir
    st = os.stat(d / "tc_helper.py")
    os.utime(d / "tc_helper.py", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    _, calls = _through(TraceCache(cache), d / "net.py")
    assert calls == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign class", "other format"])
def test_a_damaged_entry_is_a_miss_with_a_note(model_dir, damage):
    d, cache_dir, _ = model_dir
    notes: list[str] = []
    cache = TraceCache(cache_dir, note=notes.append)
    (entry,) = cache_dir.glob("*.trace")
    blob = entry.read_bytes()
    entry.write_bytes({
        "garbage": b"\x00not a pickle",
        "truncated": blob[: len(blob) // 2],
        "foreign class": pickle.dumps({"format": tracekeys.FORMAT, "graph": os.getcwd, "key": "", "sources": []}),
        "other format": pickle.dumps({"format": "hapc-trace-cache/0"}),
    }[damage])
    traced, calls = _through(cache, d / "net.py")
    assert calls == 1 and traced.graph is not None
    assert len(notes) == 1 and "corrupt" in notes[0] and "\n" not in notes[0]
    _, calls = _through(cache, d / "net.py")
    assert calls == 0          # rewritten


def _calling(module: str, name: str, argument: str) -> bytes:
    """Pickle bytes that call ``module.name(argument)`` when loaded by a plain unpickler
    (protocol 4 resolves a dotted ``name`` attribute by attribute)."""
    def text(s: str) -> bytes:
        return b"\x8c" + bytes([len(s.encode())]) + s.encode()
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(argument) + b"\x85R."


@pytest.mark.parametrize("route", ["dotted name", "builtin", "function of an IR module"])
def test_an_entry_cannot_run_code(model_dir, tmp_path, route):
    """A cache folder others can write must not run their code: the crafted entry would write a
    marker file if anything called what it names; it is refused as corrupt and traced again."""
    d, cache_dir, _ = model_dir
    marker = tmp_path / "marker"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    payload = {
        "dotted name": _calling("hapc.ir.graph", "json.codecs.builtins.exec", code),
        "builtin": _calling("builtins", "exec", code),
        "function of an IR module": _calling("hapc.ir.graph", "Graph.from_dict", "{}"),
    }[route]
    if route != "function of an IR module":       # the payload is live: a plain load runs it
        pickle.loads(payload)
        assert marker.exists()
        marker.unlink()
    notes: list[str] = []
    (entry,) = cache_dir.glob("*.trace")
    entry.write_bytes(payload)
    traced, calls = _through(TraceCache(cache_dir, note=notes.append), d / "net.py")
    assert not marker.exists()
    assert calls == 1 and len(notes) == 1 and "corrupt" in notes[0] and "not a hapc IR class" in notes[0]


def test_compile_from_the_cache_writes_the_same_plan_and_program(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    base = ["compile", str(MLP), "--cluster", SMALL_MIXED, "-q"] + MLP_SMALL
    assert main(base + ["-o", str(tmp_path / "a"), "--no-trace-cache"]) == 0
    assert not (tmp_path / "cache").exists()          # bypassed: nothing stored
    assert main(base + ["-o", str(tmp_path / "b")]) == 0        # miss: traces and stores
    assert main(base + ["-o", str(tmp_path / "c")]) == 0        # hit
    entries = list((tmp_path / "cache").glob("*.trace"))
    assert len(entries) == 1 and list((tmp_path / "cache").glob("*.strategies-fp32.json"))
    for name in ("plan.json", "program.py", "replan-cache.json"):
        a, b, c = ((tmp_path / d / name).read_text() for d in "abc")
        assert a == b == c, name


def test_a_hit_does_not_import_torch_dynamo(tmp_path, monkeypatch, capsys):
    """This process traces and stores; a fresh one must then plan from the entry. The fresh
    process takes this one's ``sys.path`` (part of the key: it decides what ``import`` finds)."""
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    args = ["compile", str(MLP), "--cluster", SMALL_MIXED, "-q", "-o", str(tmp_path / "o")] + MLP_SMALL
    assert main(args) == 0
    probe = ("import json, os, sys; sys.path[:] = json.loads(os.environ['PROBE_SYS_PATH']); "
             "from hapc.cli import main; rc = main(sys.argv[1:]); "
             "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo', "
             "'tracer' if 'hapc.frontend.tracer' in sys.modules else 'no tracer', "
             "'torch' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)")
    env = dict(os.environ, PROBE_SYS_PATH=json.dumps(sys.path))
    run = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env,
                         cwd=os.getcwd())
    assert run.returncode == 0, run.stderr
    # Planning from the entry needs no torch at all (the node strategies come with it), nor does
    # writing program.py (the graph carries the torch facts the emitter needs).
    assert run.stdout.strip().splitlines()[-1] == "no dynamo no tracer no torch", run.stderr
    assert (tmp_path / "o" / "program.py").exists()


def test_synthesize_a_model_file_through_the_cache(tmp_path, monkeypatch):
    """The API plans a model file (a path) as hapc compile does: the second call must not trace."""
    from hapc import synthesize

    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    kwargs = {"layers": 2, "features": 12, "hidden": 16, "classes": 5, "batch": 4}
    first = synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=kwargs)
    assert list((tmp_path / "cache").glob("*.strategies-fp32.json"))

    def no_trace(*args, **kwargs):
        raise AssertionError("traced although the cache holds the model")

    monkeypatch.setattr("hapc.frontend.tracer.trace", no_trace)
    again = synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=kwargs)
    assert again.cost == first.cost and again.graph.hash() == first.graph.hash()
    assert again.model["file"] == str(MLP.resolve())
    with pytest.raises(AssertionError, match="traced although"):
        synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=kwargs, trace_cache=False)


def test_damaged_strategies_fall_back_to_the_rules(tmp_path, monkeypatch):
    """Node strategies kept with an entry that cannot be used are derived again (same plan)."""
    from hapc import synthesize

    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    kwargs = {"layers": 2, "features": 12, "hidden": 16, "classes": 5, "batch": 4}
    first = synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=kwargs)
    (strategies,) = (tmp_path / "cache").glob("*.strategies-fp32.json")
    strategies.write_text('{"format": "hapc-replan-cache/1", "graph": "another"}')
    notes: list[str] = []
    again = synthesize(str(MLP), None, SMALL_MIXED, model_kwargs=kwargs, progress=notes.append)
    assert again.cost == first.cost
    assert any("cached strategies" in n and "not used" in n for n in notes)
    assert "another" not in strategies.read_text()        # rewritten from the rules


def test_prune_keeps_the_most_recently_used_entries(tmp_path):
    cache = TraceCache(tmp_path)
    for i in range(5):
        (tmp_path / f"e{i}.trace").write_bytes(b"x")
        (tmp_path / f"e{i}.strategies-fp32.json").write_text("{}")
        os.utime(tmp_path / f"e{i}.trace", ns=(10**18 + i, 10**18 + i))
    assert cache.prune(keep=2) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3.strategies-fp32.json", "e3.trace",
                                                          "e4.strategies-fp32.json", "e4.trace"]


def test_constants_with_data_come_back_from_the_cache(tmp_path):
    """A tensor made in forward is lifted out as a constant with data: the entry keeps it."""
    import torch

    path = tmp_path / "scaled.py"
    path.write_text(HELPER + '''

def model():
    return Scaled()

def inputs():
    return (torch.randn(3, 6), torch.randint(0, 4, (3,)))

class Scaled(Net):
    def __init__(self):
        super().__init__(6, 8)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.b(torch.relu(self.a(x))) * torch.tensor([1.0, 2.0, 3.0, 4.0]), y)
''')
    cache = TraceCache(tmp_path / "cache")
    first, calls = _through(cache, path, device=None)       # on meta, torch.tensor(...) would be on CPU
    used = {v.target for v in first.graph.values.values() if v.kind == "constant"}
    assert calls == 1 and used and not any(first.constants[k].is_meta for k in used)
    again, calls = _through(cache, path, device=None)
    assert calls == 0 and sorted(again.constants) == sorted(used)
    assert all(torch.equal(again.constants[k], first.constants[k]) for k in used)


def test_a_module_edited_after_it_was_loaded_is_not_stamped(model_dir):
    """A notebook edits a module it imported earlier without reloading it: the trace ran the
    old code, so it must not be stored under the file as it is now."""
    import importlib

    d, cache_dir, _ = model_dir
    notes: list[str] = []
    cache = TraceCache(cache_dir, note=notes.append)
    for entry in cache_dir.iterdir():
        entry.unlink()
    importlib.import_module("tc_helper")                    # loaded before the trace ...
    (d / "tc_helper.py").write_text(HELPER.replace("torch.relu", "torch.sigmoid") + "\n")   # ... then edited

    def trace_with_loaded_module():
        from hapc.frontend.tracer import trace

        mf = load_model_file(str(d / "net.py"), {})
        return trace(mf.build_model(device="meta"), tuple(t.to("meta") for t in mf.build_inputs()))

    traced, entry = trace_model_file(d / "net.py", {}, trace_with_loaded_module, cache=cache)
    assert entry is None and not list(cache_dir.glob("*.trace"))
    assert any("tc_helper.py was edited after this process loaded it" in n for n in notes)
    sys.modules.pop("tc_helper", None)


def test_the_key_ignores_how_hapc_was_started(tmp_path, monkeypatch):
    """``hapc`` puts its script directory first on ``sys.path``, ``python -m hapc.cli`` the
    working directory (usually also on ``PYTHONPATH``): neither changes what an import finds,
    so both compiles share one entry. A module later put in the script directory does."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    (bin_dir / "hapc").write_text("#!/usr/bin/env python\n")
    (work / "mymodel.py").write_text("")
    rest = [p for p in sys.path if p]
    monkeypatch.setattr(sys, "path", [str(bin_dir), str(work)] + rest)
    as_script = tracekeys.TraceKey.for_model_file(MLP, {})
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", ["", str(work)] + rest)
    as_module = tracekeys.TraceKey.for_model_file(MLP, {})
    assert as_script == as_module
    (bin_dir / "shadow.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(bin_dir), str(work)] + rest)
    assert tracekeys.TraceKey.for_model_file(MLP, {}) != as_module


def test_quiet_compile_prints_no_cache_notes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HAPC_CACHE_DIR", str(tmp_path / "cache"))
    args = ["compile", str(MLP), "--cluster", SMALL_MIXED, "--no-emit", "-o", str(tmp_path / "o")] + MLP_SMALL
    assert main(args + ["-q"]) == 0
    for entry in (tmp_path / "cache").glob("*.trace"):
        entry.write_bytes(b"damaged")
    capsys.readouterr()
    assert main(args + ["-q"]) == 0
    assert "note" not in capsys.readouterr().err
    for entry in (tmp_path / "cache").glob("*.trace"):
        entry.write_bytes(b"damaged")
    assert main(args) == 0
    assert "corrupt" in capsys.readouterr().err
