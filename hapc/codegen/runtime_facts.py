"""What the emitter needs to know about the runtime it copies beside a program, read from the
runtime's source text rather than by importing it.

The runtime modules (:mod:`hapc.runtime.collectives`, :mod:`hapc.runtime.local_ops`, ...) are
copied beside every program and import torch at their top, as a program must; importing them
here would load torch into ``hapc compile``'s emit and ``hapc replan``, seconds of a budget of
one. The emitter only needs a few plain facts from them: which implementation a collective
variant name maps to, and which local ops are generators (the program drives those through
``rt.drive``). Those are read from the same files that get copied, so there is one source of
truth; tests/codegen/test_emit_torch_free.py checks them against the imported modules.

Parsing a whole runtime file is a sizeable part of a replan's budget for its program, so
only the top-level statements asked about are parsed (a local op's definition, the
module's assignments), cut from the text at the lines that start a top-level statement. A cut
made in the wrong place leaves an open bracket or string, which does not parse: then the
whole file is parsed, as before.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
COLLECTIVES = RUNTIME / "collectives.py"     # copied as hapc_collectives.py
LOCAL_OPS = RUNTIME / "local_ops.py"         # copied as hapc_local_ops.py
RANDOM_OPS = RUNTIME / "random_ops.py"       # copied as hapc_random_ops.py
# The files that define local ops, by the name the program gives each module (skeleton.py's L, R).
LOCAL_OP_MODULES = {"L": LOCAL_OPS, "R": RANDOM_OPS}
PIPELINE = RUNTIME / "pipeline.py"           # copied as hapc_pipeline.py (pipelined plans)
CHECKPOINT = RUNTIME / "checkpoint.py"       # copied as hapc_checkpoint.py (--save/--load)
TIMINGS = RUNTIME / "timings.py"             # copied as hapc_timings.py (--timings)
MEMORY_METER = RUNTIME / "memory_meter.py"   # copied as hapc_memory.py (--measure-memory)
LOSS_SCALE = RUNTIME / "loss_scale.py"       # copied as hapc_loss_scale.py (fp16's loss scaling)
ZERO = RUNTIME / "zero.py"                   # copied as hapc_zero.py (ZeRO's owned rows)


@functools.cache
def _collective_names() -> dict[str, Any]:
    return _module_constants(COLLECTIVES)


@functools.cache
def random_ops() -> frozenset[str]:
    """The traced random ops the runtime draws with its counter-based generator
    (``random_ops.RANDOM_OP_NAMES``)."""
    return frozenset(_module_constants(RANDOM_OPS)["RANDOM_OP_NAMES"])


def hierarchical() -> str:
    """The runtime's name of the hierarchical implementation (``collectives.HIERARCHICAL``)."""
    return _collective_names()["HIERARCHICAL"]


def method_of(name: str) -> str:
    """As ``collectives.method_of``: the implementation behind a cost-model variant name, the
    padded one for names it does not list."""
    names = _collective_names()
    return names["_METHODS"].get(name, names["PADDED"])


@functools.cache
def _local_ops(path: Path = LOCAL_OPS) -> dict[str, bool]:
    """Each ``@local_op`` function's name in ``path`` -> whether it is a generator function."""
    return _local_ops_in(ast.parse(path.read_text(), str(path)).body)


def _local_ops_in(statements: list[ast.stmt]) -> dict[str, bool]:
    return {fn.name: _is_generator(fn) for fn in statements if isinstance(fn, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "local_op" for d in fn.decorator_list)}


@functools.cache
def _local_op(name: str, path: Path = LOCAL_OPS) -> bool:
    """Whether the local op ``name`` of ``path`` is a generator, from its definition alone when
    that can be cut out of the file cleanly (one top-level ``def name(`` with its decorators),
    else from the whole file; a KeyError when the file has no such local op."""
    chunk = _definition(_local_op_chunks(path), name)
    if chunk is not None:
        try:
            statements = ast.parse(chunk).body
        except SyntaxError:
            statements = []
        if len(statements) == 1 and isinstance(statements[0], ast.FunctionDef) and statements[0].name == name:
            return _local_ops_in(statements)[name]
    return _local_ops(path)[name]


@functools.cache
def local_op_module(name: str) -> str:
    """The program's name (``L`` or ``R``) of the runtime module that defines local op ``name``;
    a KeyError names an op neither defines. The file whose cut statements define it is found
    without parsing; a whole file is parsed only when no definition can be cut out cleanly."""
    for module, path in LOCAL_OP_MODULES.items():
        if _definition(_local_op_chunks(path), name) is not None:
            return module
    for module, path in LOCAL_OP_MODULES.items():
        try:
            _local_op(name, path)
        except KeyError:
            continue
        return module
    raise KeyError(name)


def is_generator_local_op(name: str) -> bool:
    """Whether the local op ``name`` yields collectives (and so runs under ``rt.drive``); a
    KeyError names an op the runtime does not define."""
    return _local_op(name, LOCAL_OP_MODULES[local_op_module(name)])


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
    text = path.read_text()
    try:
        statements = _assignments(text)
    except SyntaxError:         # a chunk cut inside a bracket or a string: read the whole file
        statements = ast.parse(text, str(path)).body
    return _constants_of(statements)


def _assignments(text: str) -> list[ast.stmt]:
    """The module's top-level assignments, each parsed from its own chunk of ``text``."""
    return [stmt for chunk in _top_level_chunks(text) if _ASSIGNMENT.match(chunk) for stmt in ast.parse(chunk).body]


def _constants_of(statements: list[ast.stmt]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for stmt in statements:
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


# ---- cutting a module's text into its top-level statements ----------------------------------

# A line that starts a top-level statement: not indented, not blank, not a comment, not the
# closing bracket of a statement that began above.
_STATEMENT_START = re.compile(r"^(?![\s#)\]}])", re.MULTILINE)
# The first line of an assignment to names (``A = ...``, ``A, B = ...``, ``A: T = ...``).
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s*(:[^=\n]*)?=(?!=)")


def _top_level_chunks(text: str) -> list[str]:
    """The module's text after its docstring, cut where top-level statements start (decorators
    start their definition's chunk)."""
    start = 0
    if text.startswith('"""'):
        start = text.index('"""', 3) + 3
    starts = [m.start() for m in _STATEMENT_START.finditer(text, start)] + [len(text)]
    chunks, begin = [], None
    for a, b in zip(starts, starts[1:]):
        if begin is None:
            begin = a
        if not text.startswith("@", a):     # a decorator belongs to what follows it
            chunks.append(text[begin:b])
            begin = None
    return chunks


@functools.cache
def _local_op_chunks(path: Path = LOCAL_OPS) -> tuple[str, ...]:
    return tuple(_top_level_chunks(path.read_text()))


def _definition(chunks: tuple[str, ...], name: str) -> str | None:
    """The text of the one top-level ``def name(...)`` (with its decorators) among ``chunks``,
    or None when there is none or several."""
    found = [c for c in chunks
             if re.match(rf"(@[^\n]*\n(\s*#[^\n]*\n|\s*\n)*)*def\s+{re.escape(name)}\s*\(", c)]
    return found[0] if len(found) == 1 else None


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
