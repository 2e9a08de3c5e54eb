"""The key of a trace cache entry: everything a lookup can know before tracing.

The entry's file name is the key's hash, over the model file's bytes and resolved path, the
``--set`` overrides with their types, the trace mode (block tracing on or off) and device (the
cluster's device type: model code may branch on it, :mod:`hapc.frontend.ondevice`), the torch
version and location (its ``version.py``, found with ``find_spec``: importing torch would take
seconds), Python's version, ``sys.path`` (made absolute, without repeats and without
directories that hold no module: it decides which module an ``import`` finds), the
``TORCH*``/``PYTORCH*`` environment variables (not inductor's or torchrun's) and the cache's
format. What the trace then read is checked separately (:mod:`hapc.frontend.cache.sources`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Raised when what the cache holds for a key changes: 2 since the canonical node order stopped
# depending on where the model file lies, 3 since graphs record what autograd saves per node,
# 4 since ties in that order are broken by what nodes compute, 5 since grouped matmuls have FLOPs
# and those ties are broken without sizes (which change with the batch).
FORMAT = "hapc-trace-cache/5"


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


@dataclass(frozen=True)
class TraceKey:
    """Everything a lookup can know before tracing; ``digest`` names the entry."""

    material: str          # canonical JSON of the fields below (kept in the entry, for people)
    digest: str

    @staticmethod
    def for_model_file(path: str | os.PathLike, overrides: Mapping[str, Any], *,
                       replicate_blocks: bool = True, device: str = "cpu") -> TraceKey | None:
        """The key of tracing ``path`` with ``overrides`` for ``device``; None when the file
        cannot be read (the model-file loader then reports it)."""
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
            "trace": {"replicate_blocks": bool(replicate_blocks), "device": device,
                      "tensors": "meta-built fakes, else real on cpu"},
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

