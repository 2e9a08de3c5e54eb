"""The floors of ARCHITECTURE.md: every module of hapc/, synth/, costmodel/ and profiler/ sits
on a floor, and no module imports one from a higher floor, not even inside a function (a
deferred import is still a dependency: it only hides the cycle until the call). Imports under
``if TYPE_CHECKING:`` are annotations only and do not count.

``hapc.runtime`` is on the ground floor for a stronger reason: its files are copied beside
every emitted program, so they import the standard library and torch and nothing of ours."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hapc", "synth", "costmodel", "profiler")

# Lowest first. A module's floor is that of the longest name here that contains it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("hapc.errors", "hapc.ir", "hapc.rules", "hapc.process", "hapc.runtime"),   # IR, op rules, plumbing
    ("costmodel",),
    ("synth",),
    ("hapc.frontend",),                                            # model -> traced graph
    ("hapc.codegen", "hapc.report"),                               # plan -> program, plan -> text
    ("hapc.plan",),                                                # the Plan: emit(), summary()
    ("hapc.api", "hapc.elastic"),                                  # orchestration
    ("profiler",),                                                 # measures by running plans
    ("hapc", "hapc.cli", "hapc.demo", "hapc.rules.check", "hapc.rules.__main__"),   # entry points
)
RUNTIME = "hapc.runtime"
_FLOOR_OF = {name: at for at, names in enumerate(FLOORS) for name in names}


def floor(module: str) -> int | None:
    """The floor of ``module`` (a dotted name, possibly ``package.attribute``); None for anything
    not ours (stdlib, torch, numpy, ...)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = _FLOOR_OF.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports(path: Path, package: str) -> list[tuple[str, int]]:
    """Every module the file at ``path`` (in ``package``) imports, top-level or nested, with its
    line, except under ``if TYPE_CHECKING:``. ``from p import x`` counts as importing ``p.x``:
    ``x`` may be a submodule, and ``from hapc import cli`` is not as low as ``from hapc import ir``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).parts[:-1])


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_higher_floor(path):
    own = floor(_name(path))
    wrong = [f"{path.relative_to(ROOT)}:{line} (floor {own}) imports {name} (floor {floor(name)})"
             for name, line in imports(path, _package_of(path))
             if (theirs := floor(name)) is not None and theirs > own]
    assert not wrong, "\n".join(wrong)


def test_every_module_has_its_floor():
    """A new module directly in hapc/ lands on the top floor by default; name it in FLOORS
    (and in ARCHITECTURE.md) if it belongs lower."""
    top_level = sorted(p.stem for p in (ROOT / "hapc").glob("*.py") if p.stem != "__init__")
    named = {name.split(".")[1] for names in FLOORS for name in names if name.count(".") == 1}
    assert set(top_level) <= named, f"hapc/ modules without a floor: {sorted(set(top_level) - named)}"
    packages = sorted(p.name for p in (ROOT / "hapc").iterdir() if (p / "__init__.py").exists())
    assert set(packages) <= named, f"hapc/ packages without a floor: {sorted(set(packages) - named)}"


@pytest.mark.parametrize("path", [p for p in _modules() if _within(_name(p), RUNTIME)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runtime_imports_only_the_standard_library_and_torch(path):
    allowed = set(sys.stdlib_module_names) | {"torch"}
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}" for name, line in imports(path, _package_of(path))
             if name.split(".")[0] not in allowed and not _within(name, RUNTIME)]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_deferred_upward_import_and_skips_annotations(tmp_path):
    """The rule this file guards, on a made-up module: an import inside a function counts, one
    under ``if TYPE_CHECKING:`` does not (its ``else`` does)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nfrom . import costs\n\nif TYPE_CHECKING:\n"
                     "    from hapc.plan import Plan\nelse:\n    import hapc.api\n\n"
                     "def f():\n    from hapc import cli\n    return cli\n")
    found = imports(probe, "synth")
    assert found == [("typing.TYPE_CHECKING", 1), ("synth.costs", 2), ("hapc.api", 7), ("hapc.cli", 10)]
    assert [floor(name) for name, _ in found] == [None, 2, 6, 8]


def test_floors_are_read_by_the_longest_name():
    assert floor("hapc.rules.registry") == 0 and floor("hapc.rules.check") == 8
    assert floor("hapc.plan.Plan") == 5 and floor("hapc.trace") == 8 and floor("profiler.ops") == 7
    assert floor("numpy") is None and floor("hapcx") is None
