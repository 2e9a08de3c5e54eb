"""``--config FILE``: a command's options from a TOML or YAML file; flags given on the command line
override it. Keys are the long option names (``time-budget`` or ``time_budget``); ``set`` is a
table of model settings, merged under the ``--set`` flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hapc.errors import UserError


def read_config(path: str) -> dict[str, Any]:
    """The file's top-level table (TOML by a .toml suffix, else YAML)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise UserError(f"cannot read it ({exc.strerror or type(exc).__name__})", where=path) from None
    try:
        if file.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:       # a syntax error of either format
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"not valid {'TOML' if file.suffix == '.toml' else 'YAML'} ({first})", where=path) from None
    if not isinstance(data, dict):
        raise UserError("expected a table of options, e.g. cluster = \"cluster.yaml\"", where=path)
    return data


def apply_config(args: argparse.Namespace, parser: argparse.ArgumentParser, path: str) -> None:
    """Fill ``args`` from the config file at ``path``, where the command line left an option at
    its default; every key must name an option of ``parser`` and have its type."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config")}
    for key, value in read_config(path).items():
        dest = str(key).replace("-", "_")
        action = actions.get(dest)
        if action is None:
            raise UserError(f"{key}: not an option of this command; expected one of "
                            f"{', '.join(sorted(k.replace('_', '-') for k in actions))}", where=path)
        if dest == "set":
            if not isinstance(value, dict):
                raise UserError(f"{key}: expected a table of model settings, e.g. set = {{ layers = 2 }}", where=path)
            args.set = [f"{k}={v}" for k, v in value.items()] + list(args.set)    # flags come later: they win
            continue
        if getattr(args, dest) != action.default:
            continue                                   # given on the command line
        setattr(args, dest, _typed(action, key, value, path))


def _typed(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise UserError(f"{key}: expected true or false, got {value!r}", where=path)
        return value
    if isinstance(value, (dict, list)) or value is None:
        raise UserError(f"{key}: expected a single value, got {value!r}", where=path)
    try:
        typed = action.type(str(value)) if action.type is not None else str(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise UserError(f"{key}: expected {getattr(action.type, '__name__', 'a value')}, got {value!r}",
                        where=path) from None
    if action.choices is not None and typed not in action.choices:
        raise UserError(f"{key}: expected one of {', '.join(map(str, action.choices))}, got {value!r}", where=path)
    return typed
