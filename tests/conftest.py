"""Shared test fixtures.

Example models live in ``configs/models/*.py`` as plain model files (design.md section 3), not
as an importable package, because ``hapc compile`` and the emitted program load them by path;
tests load them the same way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO / "configs" / "models"


def load_model_file(path: str | Path) -> ModuleType:
    """Import a model file by path, as ``hapc compile MODEL.py`` does; cached per path."""
    path = Path(path).resolve()
    name = f"hapc_model_file_{path.stem}_{abs(hash(str(path))) % 10**8}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load model file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_model():
    """``load_model("gpt")`` -> the module of ``configs/models/gpt.py`` (or any path)."""

    def load(name_or_path: str | Path) -> ModuleType:
        path = Path(name_or_path)
        if path.suffix != ".py":
            path = MODELS_DIR / f"{name_or_path}.py"
        return load_model_file(path)

    return load


@pytest.fixture(scope="session", autouse=True)
def _private_trace_cache(tmp_path_factory):
    """``hapc compile`` in tests (and the subprocesses they start) keep their trace cache
    (hapc.frontend.cache.store) in a folder of this session, never in the user's ``~/.cache``."""
    import os

    saved = os.environ.get("HAPC_CACHE_DIR")
    os.environ["HAPC_CACHE_DIR"] = str(tmp_path_factory.mktemp("trace-cache"))
    yield
    if saved is None:
        os.environ.pop("HAPC_CACHE_DIR", None)
    else:
        os.environ["HAPC_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _forget_modules_from_temporary_folders(tmp_path_factory):
    """After each test, unload the modules it imported from pytest's temporary folders (model
    files and helpers written by the test). Left loaded, they are stale once another test
    rewrites a file at the same place, and the trace cache (rightly) refuses to stamp a trace
    made in a process holding a module edited after it was loaded: one test's leftovers would
    change what the next test's ``hapc compile`` prints and caches."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.startswith(base):
            del sys.modules[name]
