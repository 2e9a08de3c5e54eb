"""Keep torch's own chatter out of the user's terminal while hapc traces a model.

``torch.export`` prints multi-line warnings and log records (symbolic-shape guards, graph
dumps of a failed trace, deprecation notices) through Python's ``warnings``, its ``logging``
handlers and C++ writes to the process's stdout/stderr. A user of ``hapc compile`` should see
one line when the model cannot be traced and nothing when it can, so all three are captured
here at the file-descriptor level; ``HAPC_DEBUG=1`` lets everything through as it happens.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator


def debugging() -> bool:
    return bool(os.environ.get("HAPC_DEBUG"))


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Run the body with stdout, stderr and warnings captured and dropped (unless HAPC_DEBUG)."""
    if debugging():
        yield
        return
    with warnings.catch_warnings(), tempfile.TemporaryFile(mode="w+b") as sink:
        warnings.simplefilter("ignore")
        saved = []
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            fds = [sys.stdout.fileno(), sys.stderr.fileno()]
        except (AttributeError, OSError, ValueError):   # streams without a file descriptor (notebooks)
            fds = []
        try:
            for fd in fds:
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
            with contextlib.redirect_stdout(_Null()), contextlib.redirect_stderr(_Null()):
                yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)


class _Null:
    """A text stream that drops what is written (Python-level writes while captured)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
