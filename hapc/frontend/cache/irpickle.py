"""Entries as pickle bytes that name hapc IR classes and plain Python values only.

:mod:`pickle` is exact (tuples stay tuples, floats keep every bit); the unpickler admits only
hapc IR classes and the few builtins pickle spells as globals, so an entry can neither run code
nor import torch. Anything else in an entry makes it corrupt.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

# Modules an entry may name: hapc's IR (the graph and whatever facts it carries) and the few
# plain builtins pickle spells as globals.
_ALLOWED_MODULE_PREFIXES = ("hapc.ir.",)
_ALLOWED_BUILTINS = {("builtins", n) for n in ("slice", "complex", "set", "frozenset", "list", "tuple", "dict")}


class _IRPickler(pickle.Pickler):
    """Writes the plain container behind a container subclass that reads the same
    (``torch.fx``'s ``immutable_list`` in exported arguments), so an entry names no torch
    class; one that reads differently (``torch.Size``) is kept, and the entry refused."""

    def reducer_override(self, obj: Any) -> Any:
        for base in (list, tuple, dict):
            if isinstance(obj, base) and type(obj) is not base:
                plain = base(obj)
                if repr(plain) == repr(obj):
                    return base, (plain,)
        return NotImplemented


def dump_ir(obj: Any) -> bytes:
    """``obj`` (a graph, or an entry holding one) as pickle bytes that name no torch class."""
    out = io.BytesIO()
    _IRPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


class _IRUnpickler(pickle.Unpickler):
    """Admits hapc IR classes and plain values only: an entry cannot run code or import torch."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_ALLOWED_MODULE_PREFIXES) or (module, name) in _ALLOWED_BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refers to {module}.{name}")


def load_ir(blob: bytes) -> Any:
    """What :func:`dump_ir` wrote, admitting hapc IR classes and plain values only."""
    return _IRUnpickler(io.BytesIO(blob)).load()
