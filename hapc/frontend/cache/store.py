"""A validated cache of traced graphs: a repeat ``hapc compile`` skips ``torch.export``.

Tracing costs more than searching for a deep model, and most of it is not the trace: importing
``torch`` and ``torch._dynamo`` takes seconds before the first op is seen. A user who compiles
the same model again (another cluster, another time budget, another precision) gets the same
graph, so, as ccache and torch's own FX graph cache do, the graph is stored once and reused
while nothing it was made from has changed: the entry's **key**
(:mod:`hapc.frontend.cache.keys`) and every **source** the trace read
(:mod:`hapc.frontend.cache.sources`).

The precision is not in the key: the cache holds the graph as traced, before
:func:`hapc.ir.precision.autocast_graph`, so one entry serves fp32 and bf16 plans. Beside the
graph an entry keeps, per precision, the candidate strategies of every node (the
:mod:`synth.reuse` format): with them a hit searches without the sharding rules, which import
torch. So a hit never imports ``torch._dynamo``, and with a torch-free emitter not torch.

The graph is stored as pickle bytes that name only hapc IR classes and plain values
(:mod:`hapc.frontend.cache.irpickle`). Constants with data that the graph reads (tensors
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
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapc.frontend.cache.irpickle import dump_ir, load_ir
from hapc.frontend.cache.keys import FORMAT, TraceKey
from hapc.frontend.cache.sources import Recorder, SourceStamp, edited_after_loading, listed_sources, stamps
from hapc.ir.graph import Graph

ENTRY_SUFFIX = ".trace"
CACHE_DIR_ENV = "HAPC_CACHE_DIR"
# Entries kept; writing one more removes the least recently used (a hit marks its entry used).
MAX_ENTRIES = 256
# Constant tensors an entry may hold (they are data, not graph: a model that bakes a large
# table into forward is traced each time rather than copied into the cache).
MAX_CONSTANTS_BYTES = 64 * 2**20


def default_cache_dir() -> Path:
    """``$HAPC_CACHE_DIR``, else ``$XDG_CACHE_HOME/hapc/traces``, else ``~/.cache/hapc/traces``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hapc" / "traces"


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
        sources = listed_sources(recorder.opened)
        loaded_earlier = {os.path.abspath(f) for f in (getattr(m, "__file__", None)
                                                       for name, m in recorder.preloaded.items()
                                                       if sys.modules.get(name) is m) if isinstance(f, str)}
        stale = edited_after_loading([p for p in sources if p in loaded_earlier])
        if stale is not None:
            self.note(f"not cached: {stale} was edited after this process loaded it, so the trace may not "
                      "be what the file now says")
            return None
        entry = {"format": FORMAT, "key": key.material, "graph": traced.graph, "constants": constants,
                 "sources": stamps(sources)}
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
            new = [p for p in listed_sources(set()) if p not in listed]
            stale = edited_after_loading(new)
            if stale is not None:
                raise ValueError(f"{stale} was edited after this process loaded it")
            extra = stamps(new)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
