"""Entries as pickle bytes that name hapc IR classes and plain Python values only.

:mod:`pickle` is exact (tuples stay tuples, floats keep every bit); the unpickler admits an
explicit list of classes (each class that a ``hapc.ir`` module defines, and the few builtin
containers pickle spells as globals), each by its exact name, so an entry can neither run code
nor import torch: a dotted name (``graph`` / ``json.codecs.builtins.exec``, which pickle would
resolve attribute by attribute) or a function is refused. Anything else makes the entry corrupt.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

# The plain builtins pickle spells as globals.
_ALLOWED_BUILTINS = {("builtins", n) for n in ("slice", "complex", "set", "frozenset", "list", "tuple", "dict")}
_IR_MODULES = ("hapc.ir.graph", "hapc.ir.layout", "hapc.ir.precision", "hapc.ir.program", "hapc.ir.shards")


def _ir_classes() -> dict[tuple[str, str], type]:
    """Every class a hapc IR module defines (not one it imports), by (module, name)."""
    import importlib

    found = {}
    for module_name in _IR_MODULES:
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if isinstance(obj, type) and obj.__module__ == module_name:
                found[(module_name, name)] = obj
    return found


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
    """Admits hapc IR classes and plain values only, each by its exact name: an entry cannot
    run code or import torch."""

    _classes: dict[tuple[str, str], type] | None = None

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_BUILTINS:
            return super().find_class(module, name)
        if _IRUnpickler._classes is None:
            _IRUnpickler._classes = _ir_classes()
        found = _IRUnpickler._classes.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"refers to {module}.{name}, which is not a hapc IR class")
        return found


def load_ir(blob: bytes) -> Any:
    """What :func:`dump_ir` wrote, admitting hapc IR classes and plain values only."""
    return _IRUnpickler(io.BytesIO(blob)).load()
