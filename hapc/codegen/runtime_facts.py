"""What the emitter needs to know about the runtime it copies beside a program, read from the
runtime's source text rather than by importing it.

The runtime modules (:mod:`hapc.runtime.collectives`, :mod:`hapc.runtime.local_ops`, ...) are
copied beside every program and import torch at their top, as a program must; importing them
here would load torch into ``hapc compile``'s emit and ``hapc replan``, seconds of a budget of
one. The emitter only needs a few plain facts from them: which implementation a collective
variant name maps to, and which local ops are generators (the program drives those through
``rt.drive``). Those are read from the same files that get copied, so there is one source of
truth; tests/test_emit_torch_free.py checks them against the imported modules.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
COLLECTIVES = RUNTIME / "collectives.py"     # copied as hapc_collectives.py
LOCAL_OPS = RUNTIME / "local_ops.py"         # copied as hapc_local_ops.py
PIPELINE = RUNTIME / "pipeline.py"           # copied as hapc_pipeline.py (pipelined plans)
CHECKPOINT = RUNTIME / "checkpoint.py"       # copied as hapc_checkpoint.py (--save/--load)
TIMINGS = RUNTIME / "timings.py"             # copied as hapc_timings.py (--timings)


@functools.cache
def _collective_names() -> dict[str, Any]:
    return _module_constants(COLLECTIVES)


def hierarchical() -> str:
    """The runtime's name of the hierarchical implementation (``collectives.HIERARCHICAL``)."""
    return _collective_names()["HIERARCHICAL"]


def method_of(name: str) -> str:
    """As ``collectives.method_of``: the implementation behind a cost-model variant name, the
    padded one for names it does not list."""
    names = _collective_names()
    return names["_METHODS"].get(name, names["PADDED"])


@functools.cache
def _local_ops() -> dict[str, bool]:
    """Each ``@local_op`` function's name -> whether it is a generator function."""
    tree = ast.parse(LOCAL_OPS.read_text(), str(LOCAL_OPS))
    return {fn.name: _is_generator(fn) for fn in tree.body if isinstance(fn, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "local_op" for d in fn.decorator_list)}


def is_generator_local_op(name: str) -> bool:
    """Whether the local op ``name`` yields collectives (and so runs under ``rt.drive``); a
    KeyError names an op the runtime does not define."""
    return _local_ops()[name]


def _is_generator(fn: ast.FunctionDef) -> bool:
    """What Python decides when it compiles ``fn``: a ``yield`` in its own body, not in a
    function, lambda or class nested inside it."""
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _module_constants(path: Path) -> dict[str, Any]:
    """The module-level names of ``path`` bound to literals (strings, numbers, tuples, lists,
    dicts) or to earlier such names, as Python would bind them; other statements are skipped."""
    env: dict[str, Any] = {}
    for stmt in ast.parse(path.read_text(), str(path)).body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        try:
            result = _evaluate(value, env)
        except ValueError:
            continue
        for target in targets:
            _bind(target, result, env)
    return env


def _evaluate(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_evaluate(x, env) for x in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_evaluate(k, env): _evaluate(v, env) for k, v in zip(node.keys, node.values)}
    raise ValueError("not a literal")


def _bind(target: ast.AST, value: Any, env: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        env[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) \
            and len(target.elts) == len(value):
        for t, v in zip(target.elts, value):
            _bind(t, v, env)
