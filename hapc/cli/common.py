"""What several commands share: progress lines on stderr, a transient line while tracing,
argument checks that must fail before any work."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from hapc.errors import UserError

SET_HELP = "override a keyword argument of model()/inputs(), e.g. --set layers=2"


class ExamplesFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that an epilog starting with "examples:" keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def examples(*lines: str) -> dict:
    """``add_parser`` keywords for a command's examples, shown under its --help."""
    return {"epilog": "examples:\n" + "\n".join(f"  {line}" for line in lines), "formatter_class": ExamplesFormatter}


def key_value(text: str) -> str:
    """An argparse type for ``--set``: KEY=VALUE, or a usage error that shows the form."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. --set layers=2 (got {text!r})")
    return text


def progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Where a command's progress lines go: stderr, or nowhere with ``--quiet``."""
    if getattr(args, "quiet", False):
        return lambda msg: None
    return lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def transient(msg: str, *, quiet: bool) -> Iterator[None]:
    """A progress line on a terminal that is erased when the work ends, so that a failure
    (a model torch.export cannot trace) leaves exactly its one error line."""
    show = not quiet and sys.stderr.isatty()
    if show:
        print(f"  {msg}", end="\r", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        if show:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def print_notes(notes: list[str], args: argparse.Namespace) -> None:
    """How an input was read, where the user should know (``hapc: note: ...``), unless --quiet."""
    if not getattr(args, "quiet", False):
        for note in notes:
            print(f"hapc: note: {note}", file=sys.stderr)


def check_precision(name: str, *, allow_auto: bool = True) -> None:
    """Bad --precision fails before any work, in one line."""
    from hapc.ir.precision import check_precision as check

    try:
        check(name, allow_auto=allow_auto)
    except ValueError as exc:
        raise UserError(str(exc), where="--precision") from None


@contextlib.contextmanager
def output_folder(path: str) -> Iterator[Path]:
    """The command's output folder, made if missing. Writing into it may fail (a full disk, no
    permission): that is one line naming the folder, and a folder this command made is removed
    again, so no half-written plan is left for a later run to pick up."""
    out = Path(path)
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        yield out
    except OSError as exc:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"cannot write the output ({reason}: {exc.filename or out})", where=str(out)) from None
