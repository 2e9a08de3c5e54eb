"""Errors that are the user's to fix.

A :class:`UserError` is reported as one line (``hapc: <message>``) with exit code 2 and no
traceback; anything else escaping the CLI is our bug (exit 1). Messages name what is wrong
and where: the file, the field path, the op and the user's source line.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a missing file, a malformed cluster, a model file without ``model()``."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
