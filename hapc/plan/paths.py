"""How plan.json names its model file: relative to plan.json's own folder where the two share
a folder below the filesystem's root, so that a plan and its model move together (another
checkout, a CI golden, a colleague's machine) and the file names no one's home directory; an
absolute path otherwise (``../../../../work/x/model.py`` helps no one)."""

from __future__ import annotations

import os
from pathlib import Path


def stored_model_path(model_file: str, plan_file: Path) -> str:
    """``model_file`` as plan.json at ``plan_file`` stores it (POSIX separators when relative)."""
    model, folder = os.path.abspath(model_file), os.path.abspath(plan_file.parent)
    try:
        shared = os.path.commonpath([model, folder])
    except ValueError:          # different drives
        return model_file
    if os.path.dirname(shared) == shared:        # only the root in common
        return model
    return Path(os.path.relpath(model, folder)).as_posix()


def loaded_model_path(model_file: str, plan_file: str | Path) -> str:
    """The model file of a plan.json as an absolute path (plans written before paths were
    relative hold absolute ones, kept as they are)."""
    if os.path.isabs(model_file):
        return model_file
    return os.path.normpath(os.path.join(os.path.abspath(Path(plan_file).parent), model_file))
