"""A validated cache of traced graphs: a repeat ``hapc compile`` skips ``torch.export``.

Tracing costs more than searching for a deep model, and most of it is not the trace: importing
``torch`` and ``torch._dynamo`` takes seconds before the first op is seen. A user who compiles
the same model again (another cluster, another time budget, another precision) gets the same
graph, so, as ccache and torch's own FX graph cache do, the graph is stored once and reused
while nothing it was made from has changed.

What decides a traced graph, and so what an entry is checked against:

* the **key** (the entry's file name is its hash): the model file's bytes and resolved path,
  the ``--set`` overrides with their types, the trace mode (block tracing on or off), the
  torch version and location (its ``version.py``, found with ``find_spec``: importing torch
  would take seconds), Python's version, ``sys.path`` (made absolute, without repeats and
  without directories that hold no module: it decides which module an ``import`` finds), the
  ``TORCH*``/``PYTORCH*`` environment variables (not inductor's or torchrun's) and this
  cache's format;
* the **sources**: every Python file loaded in the process when the entry was written (the
  model's own modules, the libraries it used, hapc's tracer, rules and search), and every
  file opened for reading while the model file was loaded, built and traced (a
  configuration a model reads), each with its size, ``mtime_ns`` and (outside
  site-packages) SHA-256. A hit needs every one unchanged, as Python checks a ``.pyc``
  against its source: a different stat is forgiven only when the content hash still matches
  (a ``git checkout`` that touched the file).
  The standard library (Python's version is in the key) and torch's own files (torch's
  version is) are not listed. A trace is not stored while a module loaded before it began
  may run other code than its file now holds (edited since this process started and no
  longer matching its ``.pyc``: a notebook that did not reload it); the entry would stamp old
  code's graph with the new file.

The precision is not in the key: the cache holds the graph as traced, before
:func:`hapc.ir.precision.autocast_graph`, so one entry serves fp32 and bf16 plans. Beside the
graph an entry keeps, per precision, the candidate strategies of every node (the
:mod:`synth.reuse` format): with them a hit searches without the sharding rules, which import
torch. So a hit never imports ``torch._dynamo``, and with a torch-free emitter not torch.

The graph is stored with :mod:`pickle` (exact: tuples stay tuples, floats keep every bit) and
read back by an unpickler that admits only hapc IR classes and plain Python values, so an
entry can neither run code nor import torch. Constants with data that the graph reads (tensors
``torch.export`` lifted out of forward, such as the empty tensors of Hugging Face attention)
are torch objects: they are kept as ``torch.save`` bytes beside the graph and loaded (which
imports torch, not ``torch._dynamo``) only when the program is written.

An unreadable, corrupt or stale entry is a miss, with one line saying why; the model is then
traced as if there were no cache, and the entry rewritten. ``HAPC_CACHE_DIR`` moves the cache
(default ``~/.cache/hapc/traces``); ``hapc compile --no-trace-cache`` bypasses it. The
:data:`MAX_ENTRIES` most recently used entries are kept.

Not covered (as ccache does not cover them either): a model whose graph depends on something
other than files, its settings and ``TORCH*`` variables (the time, the network, another
environment variable), and files an installer changed while keeping their size and
modification time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import pickle
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapc.ir.graph import Graph

FORMAT = "hapc-trace-cache/1"
ENTRY_SUFFIX = ".trace"
CACHE_DIR_ENV = "HAPC_CACHE_DIR"
# Entries kept; writing one more removes the least recently used (a hit marks its entry used).
# A 48-layer GPT's entry is under a megabyte.
MAX_ENTRIES = 256
# Constant tensors an entry may hold (they are data, not graph: a model that bakes a large
# table into forward is traced each time rather than copied into the cache).
MAX_CONSTANTS_BYTES = 64 * 2**20
# Modules an entry may name: hapc's IR (the graph and whatever facts it carries) and the few
# plain builtins pickle spells as globals. Anything else in an entry makes it corrupt.
_ALLOWED_MODULE_PREFIXES = ("hapc.ir.",)
_ALLOWED_BUILTINS = {("builtins", n) for n in ("slice", "complex", "set", "frozenset", "list", "tuple", "dict")}


def default_cache_dir() -> Path:
    """``$HAPC_CACHE_DIR``, else ``$XDG_CACHE_HOME/hapc/traces``, else ``~/.cache/hapc/traces``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hapc" / "traces"


def torch_version() -> str:
    """The version of the torch ``import torch`` would load, without importing it (seconds):
    its ``version.py`` (``__version__`` and the git commit it was built from), else its package
    metadata."""
    origin = _torch_location()
    if origin != "none":
        try:
            text = (Path(origin).parent / "version.py").read_text()
            lines = [ln.strip() for ln in text.splitlines() if ln.startswith(("__version__", "git_version"))]
            if lines:
                return "; ".join(lines)
        except OSError:
            pass
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _torch_location() -> str:
    """Where ``import torch`` would load torch from (a source checkout on ``sys.path`` is
    another torch than the installed one), found without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return "none"
    return str(spec.origin) if spec is not None and spec.origin else "none"


# ---- the key ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceKey:
    """Everything a lookup can know before tracing; ``digest`` names the entry."""

    material: str          # canonical JSON of the fields below (kept in the entry, for people)
    digest: str

    @staticmethod
    def for_model_file(path: str | os.PathLike, overrides: Mapping[str, Any], *,
                       replicate_blocks: bool = True) -> TraceKey | None:
        """The key of tracing ``path`` with ``overrides``; None when the file cannot be read
        (the model-file loader then reports it)."""
        resolved = Path(path).resolve()
        try:
            data = resolved.read_bytes()
        except OSError:
            return None
        fields = {
            "format": FORMAT,
            "model_file": str(resolved),
            "model_sha256": hashlib.sha256(data).hexdigest(),
            "overrides": sorted([k, type(v).__name__, repr(v)] for k, v in overrides.items()),
            "trace": {"replicate_blocks": bool(replicate_blocks), "device": "meta, else real tensors"},
            "torch": [torch_version(), _torch_location()],
            "python": sys.version,
            "sys_path": _import_path(),
            "env": sorted([k, v] for k, v in os.environ.items() if _may_change_export(k)),
        }
        material = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return TraceKey(material, hashlib.sha256(material.encode()).hexdigest()[:32])


def _import_path() -> list[str]:
    """``sys.path`` as far as it decides which file an ``import`` finds: entries made absolute
    (``""`` is the working directory), each directory once (a repeat finds nothing its first
    place did not), and without directories that hold nothing importable. The ``hapc``
    script puts its ``bin`` directory first where ``python -m hapc.cli`` puts the working
    directory, which is usually also on ``PYTHONPATH``: both compiles then share one entry.
    The key is made again at every lookup, so a module later added to a dropped directory
    changes it."""
    seen: dict[str, None] = {}
    for entry in sys.path:
        where = os.path.abspath(entry or os.curdir)
        if where not in seen and _may_import_from(where):
            seen[where] = None
    return list(seen)


def _may_import_from(directory: str) -> bool:
    """False only for an existing directory with no subdirectory (a package, or a namespace
    package) and no file a module may be loaded from (``.py``, ``.pyc``, extension modules):
    a console scripts' ``bin``. Anything else (a zip, a path that does not exist yet) stays."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    try:
        with os.scandir(directory) as entries:
            return any(e.name.endswith(suffixes) or e.is_dir() for e in entries)
    except OSError:             # not a directory, or not there (yet)
        return True


def _may_change_export(variable: str) -> bool:
    """Environment variables torch reads that could change what it exports; not inductor's
    (export never compiles; importing torch sets ``TORCHINDUCTOR_CACHE_DIR`` itself) nor
    torchrun's."""
    return variable.startswith(("TORCH", "PYTORCH")) and not variable.startswith(("TORCHINDUCTOR_", "TORCHELASTIC_"))


# ---- the sources a trace read -------------------------------------------------------------------

@dataclass(frozen=True)
class SourceStamp:
    """One file a trace depended on, as it was. ``sha256`` is empty for installed packages'
    files (site-packages: hundreds of them, changed only by an install, which also changes
    their stat), so that writing an entry does not read them all."""

    path: str
    size: int
    mtime_ns: int
    sha256: str

    @staticmethod
    def of(path: str, *, installed: tuple[str, ...] = ()) -> SourceStamp | None:
        try:
            st = os.stat(path)
            digest = "" if path.startswith(installed) else _file_sha256(path)
        except OSError:
            return None
        return SourceStamp(path, st.st_size, st.st_mtime_ns, digest)

    def changed(self) -> bool:
        """Whether the file is not what it was: missing, or different in stat and (where it
        was hashed) in content."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        if st.st_size == self.size and st.st_mtime_ns == self.mtime_ns:
            return False
        if st.st_size != self.size or not self.sha256:
            return True
        try:
            return _file_sha256(self.path) != self.sha256
        except OSError:
            return True


def _file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _stamps(paths: list[str]) -> list[list[Any]]:
    """The stamps of ``paths`` (missing files left out), as an entry stores them."""
    installed = tuple(_unlisted_roots()[2])
    stamps = (SourceStamp.of(p, installed=installed) for p in paths)
    return [[s.path, s.size, s.mtime_ns, s.sha256] for s in stamps if s is not None]


@functools.cache
def process_start_ns() -> int | None:
    """When this process started, to within tens of milliseconds and never later than it did
    (Linux: its start in clock ticks after boot against the uptime, from /proc); None where
    that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        age_s = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time_ns() - int(age_s * 1e9) - 50_000_000      # the tick and the uptime's rounding
    except (OSError, ValueError, IndexError):
        return None


def _executed(event: str, args: tuple) -> None:
    """Audit hook: when each Python file's code last ran (a module's body runs once per load)."""
    if event == "exec" and args:
        filename = getattr(args[0], "co_filename", None)
        if isinstance(filename, str) and filename.endswith(".py"):
            _EXECUTED_NS[filename] = time.time_ns()


_EXECUTED_NS: dict[str, int] = {}
_IMPORTED_NS = time.time_ns()       # where the process start is unknown: no later than this
sys.addaudithook(_executed)


def _edited_after_loading(paths: list[str]) -> str | None:
    """The first of ``paths`` (files of modules this process loaded earlier), outside
    site-packages, that may have been edited since it was loaded: its module may run other
    code than the file now holds (a notebook that edited a module without reloading it), so
    a trace made with it must not be stamped with the file as it is now. Safe: a file not
    modified since its code last ran here (seen by an audit hook from the time this module
    was imported; before that, since the process started), or whose compiled ``.pyc`` still
    records its current size and modification time."""
    started = process_start_ns()
    since = started if started is not None else _IMPORTED_NS     # no later than the true start
    installed = tuple(_unlisted_roots()[2])
    for path in paths:
        if path.startswith(installed):
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue            # not a file (torch.classes says ``_classes.py``): nothing is stamped
        if st.st_mtime_ns >= _EXECUTED_NS.get(path, since) and not _bytecode_matches(path, st):
            return path
    return None


def _bytecode_matches(path: str, st: os.stat_result) -> bool:
    """Whether ``path``'s cached bytecode was compiled from the file as it is now (the header
    Python checks: source modification time in whole seconds and size)."""
    try:
        with open(importlib.util.cache_from_source(path), "rb") as f:
            header = f.read(16)
    except (OSError, ValueError, NotImplementedError):
        return False
    if len(header) < 16 or int.from_bytes(header[4:8], "little") != 0:      # not a timestamp pyc
        return False
    return (int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF and
            int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)


class Recorder:
    """Collects the files opened for reading while a model is loaded, built and traced.

    Python's audit hooks see every ``open`` (imports included); one hook is installed per
    process, on first use, and forwards to the recorder that is active, if any.
    """

    _active: Recorder | None = None
    _hooked = False

    def __init__(self) -> None:
        self.opened: set[str] = set()
        self.preloaded: dict[str, Any] = {}    # the modules loaded before the model file was

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        if not Recorder._hooked:
            sys.addaudithook(_audit)
            Recorder._hooked = True
        outer, Recorder._active = Recorder._active, self
        self.preloaded = dict(sys.modules)
        try:
            yield self
        finally:
            Recorder._active = outer


def _audit(event: str, args: tuple) -> None:
    # Called for every audit event of the process (tens of thousands while torch imports):
    # the common cases return first.
    if event != "open":
        return
    recorder = Recorder._active
    if recorder is None:
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(mode, str):
        reading = not any(c in mode for c in "wax+")
    else:
        reading = isinstance(flags, int) and (flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)) == 0
    if not reading:
        return
    if isinstance(path, str) and path.startswith("/") and "/." not in path and "//" not in path:
        recorder.opened.add(path)              # already what abspath would give
    elif isinstance(path, (str, bytes, os.PathLike)):
        with contextlib.suppress(Exception):
            recorder.opened.add(os.path.abspath(os.fsdecode(path)))


def _unlisted_roots() -> tuple[list[str], list[str], list[str]]:
    """(torch's directory, the standard library's, site-packages'): files in the first two
    are covered by the key instead of listed, except third-party ones in site-packages
    where a distribution puts that inside the standard library's directory."""
    torch_dirs = []
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        torch_dirs.append(os.path.dirname(os.path.abspath(torch_mod.__file__)))
    paths = sysconfig.get_paths()

    def dirs(names: tuple[str, ...]) -> list[str]:
        return [os.path.join(os.path.abspath(paths[k]), "") for k in names if paths.get(k)]

    return [os.path.join(d, "") for d in torch_dirs], dirs(("stdlib", "platstdlib")), dirs(("purelib", "platlib"))


def _listed_sources(opened: set[str]) -> list[str]:
    """The files an entry is checked against: loaded modules plus ``opened`` regular files."""
    torch_dirs, stdlib, site = _unlisted_roots()
    paths: set[str] = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file and os.path.isfile(file):
            paths.add(os.path.abspath(file))
    for path in opened:
        if path.endswith(".pyc") or path.startswith(("/proc/", "/sys/", "/dev/")):
            continue       # compiled copies of listed sources; kernel files
        if os.path.isfile(path):
            paths.add(path)

    def listed(p: str) -> bool:
        if p.startswith(tuple(torch_dirs)):
            return False
        return not p.startswith(tuple(stdlib)) or p.startswith(tuple(site))

    return sorted(p for p in paths if listed(p))


# ---- entries ------------------------------------------------------------------------------------

@dataclass
class CachedTrace:
    """A graph from the cache, standing in for :class:`hapc.frontend.tracer.Traced` (which holds torch
    objects): the same ``graph``, no module, and the constants with data the graph reads
    (loaded on first use; see :class:`StoredConstants`)."""

    graph: Graph
    seconds: float
    entry: Path
    constants: Mapping[str, Any] = field(default_factory=dict)
    module: Any = None
    from_cache: bool = True
    strategies_installed: bool = False      # whether the last search got its strategies from the entry
    note: Callable[[str], None] = field(default=lambda msg: None, repr=False)

    def dataless_constants(self) -> list[str]:
        return []

    def strategies_file(self, precision: str) -> Path:
        return strategies_path(self.entry, precision)

    def install_strategies(self, graph: Graph, precision: str) -> bool:
        """Give the search ``graph``'s (the autocast graph's) strategies from the entry, so it
        needs no sharding rules; False when the entry has none for it (the rules derive them)."""
        from synth import reuse

        path = self.strategies_file(precision)
        self.strategies_installed = False
        if not path.exists():
            return False          # none yet at this precision: this compile writes them
        try:
            reuse.load(graph, path)
        except Exception as exc:  # stale or damaged: the rules derive them, and they are rewritten
            self.note(f"cached strategies {path} not used ({_first_line(exc)}); deriving them from the rules")
            return False
        self.strategies_installed = True
        return True


class StoredConstants(Mapping):
    """A trace's constant tensors as an entry keeps them (``torch.save`` bytes): their names
    are known at once, the tensors are loaded (importing torch) when first read."""

    def __init__(self, blob: bytes, names: list[str]) -> None:
        self._blob, self._names, self._tensors = blob, names, None

    def _loaded(self) -> dict[str, Any]:
        if self._tensors is None:
            import torch

            self._tensors = torch.load(io.BytesIO(self._blob), weights_only=True)
        return self._tensors

    def __getitem__(self, name: str) -> Any:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _constant_names(graph: Graph) -> list[str]:
    return sorted({v.target for v in graph.values.values() if v.kind == "constant" and v.target})


def constants_blob(traced: Any) -> list[Any] | None:
    """``[names, torch.save bytes]`` of the constants with data that ``traced``'s graph reads
    (what the emitter writes to constants.pt; constants without data, traced on the meta
    device, are re-derived by the program itself), or None when there are none."""
    used = set(_constant_names(traced.graph))
    kept = {k: t for k, t in (getattr(traced, "constants", None) or {}).items()
            if k in used and not t.is_meta}
    if not kept:
        return None
    import torch            # the constants are tensors: torch is loaded already

    buffer = io.BytesIO()
    torch.save(kept, buffer)
    return [sorted(kept), buffer.getvalue()]


def strategies_path(entry: Path, precision: str) -> Path:
    return entry.with_name(f"{entry.stem}.strategies-{precision}.json")


class TraceCache:
    """The cache directory: look up, store and refresh entries. ``note`` gets the one-line
    reasons an entry could not be used or written."""

    def __init__(self, root: str | os.PathLike | None = None, *, note: Callable[[str], None] | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.note = note or (lambda msg: None)

    def entry_path(self, key: TraceKey) -> Path:
        return self.root / f"{key.digest}{ENTRY_SUFFIX}"

    def lookup(self, key: TraceKey) -> CachedTrace | None:
        """The cached graph of ``key`` if its entry is sound and every source is unchanged."""
        start = time.perf_counter()
        path = self.entry_path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.note(f"trace cache entry {path} unreadable ({type(exc).__name__}); tracing again")
            return None
        try:
            entry = load_ir(blob)
            if not isinstance(entry, dict) or entry.get("format") != FORMAT:
                raise ValueError(f"format {entry.get('format') if isinstance(entry, dict) else None!r}")
            if entry["key"] != key.material:
                raise ValueError("made for another key")
            graph, sources = entry["graph"], [SourceStamp(*s) for s in entry["sources"]]
            if not isinstance(graph, Graph):
                raise ValueError(f"holds a {type(graph).__name__}, not a graph")
            constants = entry["constants"]         # None, or [names, torch.save bytes]
            if constants is not None and not (isinstance(constants[1], bytes) and
                                              all(isinstance(n, str) for n in constants[0])):
                raise ValueError("constants stored in another form")
        except Exception as exc:  # any damage at all is a miss, never a crash
            self.note(f"trace cache entry {path} is corrupt ({type(exc).__name__}: {_first_line(exc)}); "
                      "tracing again")
            return None
        changed = next((s.path for s in sources if s.changed()), None)
        if changed is not None:
            self.note(f"{changed} changed since the cached trace; tracing again")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)                          # recently used: the last to be pruned
        stored = StoredConstants(constants[1], list(constants[0])) if constants is not None else {}
        return CachedTrace(graph, time.perf_counter() - start, path, stored, note=self.note)

    def store(self, key: TraceKey, traced: Any, recorder: Recorder) -> Path | None:
        """Write ``traced``'s graph under ``key``, listing every source it depended on; None
        (with a note) when it cannot be cached or the directory cannot be written."""
        try:
            constants = constants_blob(traced)
        except Exception as exc:
            self.note(f"not cached: its constant tensors cannot be stored ({type(exc).__name__}: {_first_line(exc)})")
            return None
        if constants is not None and len(constants[1]) > MAX_CONSTANTS_BYTES:
            self.note(f"not cached: its constant tensors take {len(constants[1]) / 1e6:.0f} MB")
            return None
        sources = _listed_sources(recorder.opened)
        loaded_earlier = {os.path.abspath(f) for f in (getattr(m, "__file__", None)
                                                       for name, m in recorder.preloaded.items()
                                                       if sys.modules.get(name) is m) if isinstance(f, str)}
        stale = _edited_after_loading([p for p in sources if p in loaded_earlier])
        if stale is not None:
            self.note(f"not cached: {stale} was edited after this process loaded it, so the trace may not "
                      "be what the file now says")
            return None
        entry = {"format": FORMAT, "key": key.material, "graph": traced.graph, "constants": constants,
                 "sources": _stamps(sources)}
        try:
            blob = dump_ir(entry)
            if load_ir(blob)["graph"] != traced.graph:
                raise ValueError("the graph does not read back equal")
        except Exception as exc:
            self.note(f"not cached: the traced graph cannot be stored ({type(exc).__name__}: {_first_line(exc)})")
            return None
        path = self.entry_path(key)
        try:
            for old in path.parent.glob(f"{path.stem}.strategies-*.json"):
                old.unlink(missing_ok=True)         # another trace's strategies
            _write_atomic(path, blob)
            self.prune()
        except OSError as exc:
            self.note(f"trace cache {self.root} not writable ({type(exc).__name__}: {_first_line(exc)})")
            return None
        return path

    def prune(self, keep: int | None = None) -> int:
        """Remove all but the ``keep`` (default :data:`MAX_ENTRIES`) most recently used entries,
        with their strategies; returns how many entries went."""
        keep = MAX_ENTRIES if keep is None else keep
        entries = []
        for entry in self.root.glob(f"*{ENTRY_SUFFIX}"):
            with contextlib.suppress(OSError):
                entries.append((entry.stat().st_mtime_ns, entry))
        entries.sort(reverse=True)
        for _, entry in entries[keep:]:
            for path in [entry, *entry.parent.glob(f"{entry.stem}.strategies-*.json")]:
                with contextlib.suppress(OSError):
                    path.unlink()
        return max(0, len(entries) - keep)

    def store_strategies(self, entry: Path, precision: str, graph: Graph) -> None:
        """Keep the node strategies of ``graph`` (the graph a search of this entry's trace at
        ``precision`` used, :mod:`synth.reuse` format) with the entry, for the next hit. They
        were derived by modules the trace did not load (the search space), so those join the
        entry's sources; the strategies file names its graph's fingerprint, which
        :mod:`synth.reuse` checks before a search uses it."""
        from synth import reuse

        try:
            entry_data = load_ir(entry.read_bytes())
            listed = {s[0] for s in entry_data["sources"]}
            new = [p for p in _listed_sources(set()) if p not in listed]
            stale = _edited_after_loading(new)
            if stale is not None:
                raise ValueError(f"{stale} was edited after this process loaded it")
            extra = _stamps(new)
            if extra:
                entry_data["sources"] = entry_data["sources"] + extra
                _write_atomic(entry, dump_ir(entry_data))
            with tempfile.TemporaryDirectory(dir=entry.parent) as tmp:
                written = reuse.write(graph, Path(tmp) / reuse.FILE_NAME)
                _write_atomic(strategies_path(entry, precision), written.read_bytes())
        except Exception as exc:  # the entry itself stays usable; only the strategies are lost
            self.note(f"strategies not cached in {self.root} ({type(exc).__name__}: {_first_line(exc)})")


def _write_atomic(path: Path, blob: bytes) -> None:
    """Write via a temporary file and a rename, so a reader never sees half an entry (two
    compiles may write the same entry at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _IRPickler(pickle.Pickler):
    """Writes the plain container behind a container subclass that reads the same
    (``torch.fx``'s ``immutable_list`` in exported arguments), so an entry names no torch
    class; one that reads differently (``torch.Size``) is kept, and the entry refused."""

    def reducer_override(self, obj: Any) -> Any:
        for base in (list, tuple, dict):
            if isinstance(obj, base) and type(obj) is not base:
                plain = base(obj)
                if repr(plain) == repr(obj):
                    return base, (plain,)
        return NotImplemented


def dump_ir(obj: Any) -> bytes:
    """``obj`` (a graph, or an entry holding one) as pickle bytes that name no torch class."""
    out = io.BytesIO()
    _IRPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


class _IRUnpickler(pickle.Unpickler):
    """Admits hapc IR classes and plain values only: an entry cannot run code or import torch."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_ALLOWED_MODULE_PREFIXES) or (module, name) in _ALLOWED_BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refers to {module}.{name}")


def load_ir(blob: bytes) -> Any:
    """What :func:`dump_ir` wrote, admitting hapc IR classes and plain values only."""
    return _IRUnpickler(io.BytesIO(blob)).load()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
