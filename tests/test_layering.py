"""The layers of design.md: ``hapc.ir`` <- ``costmodel`` <- ``synth`` <- ``hapc`` (API, CLI,
codegen). A lower layer never imports a higher one, not even inside a function (a deferred
import is still a dependency: it only hides the cycle until the call).

The base layer is wider than ``hapc.ir`` in fact, and this test says so: ``hapc.errors``
(``UserError``, stdlib only: the cost model and the search report bad input too) and the op
sharding rules, ``hapc.rules`` (the registry and its specs import only ``hapc.ir``; the search
asks them for each node's strategies), except the rules' checker, ``hapc.rules.check``, a tool
that runs the executor."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = ("hapc.ir", "hapc.errors", "hapc.rules", "hapc.process")
ABOVE_BASE = ("hapc.rules.check", "hapc.rules.__main__")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer(module: str) -> int | None:
    """0 the base, 1 costmodel, 2 synth, 3 the rest of hapc; None for anything else (stdlib,
    torch, numpy, ...)."""
    if _within(module, BASE) and not _within(module, ABOVE_BASE):
        return 0
    return {"costmodel": 1, "synth": 2, "hapc": 3}.get(module.split(".")[0])


def imports(path: Path, package: str) -> list[tuple[str, int]]:
    """Every module the file at ``path`` (in ``package``) imports, top-level or nested, with
    its line. ``from p import x`` counts as importing ``p.x``: ``x`` may be a submodule, and
    ``from hapc import cli`` is not as low as ``from hapc import ir``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            # the name may be a submodule (``from hapc import cli``), whose layer may differ
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _lower_modules() -> list[Path]:
    paths = [p for folder in ("hapc/ir", "hapc/rules", "hapc/process", "costmodel", "synth") for p in (ROOT / folder).rglob("*.py")]
    paths.append(ROOT / "hapc" / "errors.py")
    return sorted(p for p in paths if layer(_name(p)) is not None and layer(_name(p)) < 3)


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


@pytest.mark.parametrize("path", _lower_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_higher_layer(path):
    own = layer(_name(path))
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}" for name, line in imports(path, ".".join(path.relative_to(ROOT).parts[:-1]))
             if (theirs := layer(name)) is not None and theirs > own]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_deferred_upward_import(tmp_path):
    """The rule this file guards, on a made-up module: an import inside a function counts."""
    probe = tmp_path / "probe.py"
    probe.write_text("from . import costs\n\ndef f():\n    from hapc import cli\n    return cli\n")
    found = imports(probe, "synth")
    assert found == [("synth.costs", 1), ("hapc.cli", 4)]
    assert [layer(name) for name, _ in found] == [2, 3]
