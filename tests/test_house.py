"""The shape of the tree that ARCHITECTURE.md promises: a thin hapc/ top level (the rest lives
in packages by floor), no source file over 600 lines, and a command line of one module per
command."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600


def test_hapc_top_level_holds_at_most_six_modules():
    modules = sorted(p.name for p in (ROOT / "hapc").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 6, f"hapc/ top level: {modules}; put new modules in the package of their floor"


def test_no_source_file_is_over_600_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for package in ("hapc", "synth", "costmodel", "profiler")
            for p in sorted((ROOT / package).rglob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, "split along a seam, or tighten:\n" + "\n".join(long)


def test_test_modules_have_unique_names():
    """tests/ folders are not packages: two test files of one name in two folders stop pytest's
    collection of the whole suite ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_each_command_has_its_own_module():
    from hapc.cli import COMMANDS, build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices) == [c.__name__.rsplit(".", 1)[1].replace("_", "-") for c in COMMANDS]


def test_every_command_has_examples_and_every_argument_a_help_text():
    import argparse

    from hapc.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    missing = []
    for name, parser in sub.choices.items():
        if not (parser.epilog or "").startswith("examples:\n"):
            missing.append(f"hapc {name}: no examples")
        missing += [f"hapc {name} {'/'.join(a.option_strings) or a.dest}: no help" for a in parser._actions
                    if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, "\n".join(missing)
