"""What a trace read, and whether it has changed since.

An entry lists every Python file loaded in the process when it was written (the model's own
modules, the libraries it used, hapc's tracer, rules and search), and every file opened for
reading while the model file was loaded, built and traced (a configuration a model reads; see
:class:`Recorder`), each with its size, ``mtime_ns`` and (outside site-packages) SHA-256
(:class:`SourceStamp`). A hit needs every one unchanged, as Python checks a ``.pyc`` against
its source: a different stat is forgiven only when the content hash still matches (a ``git
checkout`` that touched the file). The standard library (Python's version is in the key) and
torch's own files (torch's version is) are not listed.

A trace is not stored while a module loaded before it began may run other code than its file
now holds (edited since this process started and no longer matching its ``.pyc``: a notebook
that did not reload it, see :func:`edited_after_loading`); the entry would stamp old code's
graph with the new file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


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


def stamps(paths: list[str]) -> list[list[Any]]:
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


def edited_after_loading(paths: list[str]) -> str | None:
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


def listed_sources(opened: set[str]) -> list[str]:
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


