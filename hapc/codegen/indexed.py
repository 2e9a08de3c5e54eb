"""Tables written once per layer pattern: ``f'blocks.{i}.ln1.weight' for i in range(48)``.

A deep model's tables (parameters, pieces, gradient order, the calls of a block) repeat one
group of rows per layer with only the layer's numbers changed. Rows are compared with their
digit runs blanked out; a stretch of equal groups (:mod:`hapc.ir.repeats`) whose numbers
move by a fixed step from one group to the next is written as one comprehension over ``i``.
Every table written this way is evaluated back and compared with its rows; any difference and
it is written out row by row instead, so the shorter form can never change the program.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hapc.ir.repeats import longest_repeat

MIN_COPIES = 3            # two copies of a group read better written out
WIDTH = 110               # wrap rows of many cells at about this many characters
RUN_MIN_LENGTH = 12       # per-rank tuples at least this long are written as runs
DIGITS = re.compile(r"\d+")
HOLE = "\u27e6{}\u27e7"   # stands for an index expression inside a template while it is quoted

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Ranged:
    """``len(rows) * count`` rows: ``rows`` (templates: Python source per cell) for each ``i`` of ``loop``."""

    rows: tuple[tuple[str, ...], ...]
    loop: str                   # "range(48)"


Item = Row | Ranged


def compress(rows: list[Row]) -> list[Item]:
    """Rows, with stretches of repeated groups of rows replaced by :class:`Ranged` items."""
    shapes = [tuple(DIGITS.sub("#", c) if isinstance(c, str) else ("=", repr(c)) for c in row) for row in rows]
    out: list[tuple[int, Item]] = []

    def search(lo: int, hi: int) -> None:
        found = longest_repeat(shapes[lo:hi], min_copies=MIN_COPIES)
        if found is None:
            out.extend((i, rows[i]) for i in range(lo, hi))
            return
        start, period, copies = found.start + lo, found.period, found.copies
        stop = start + period * copies
        ranged = _template([rows[start + k * period:start + (k + 1) * period] for k in range(copies)])
        if ranged is None:
            out.extend((i, rows[i]) for i in range(start, stop))
        else:
            out.append((start, ranged))
        search(lo, start)
        search(stop, hi)

    search(0, len(rows))
    return [item for _, item in sorted(out, key=lambda x: x[0])]


def _template(groups: list[list[Row]]) -> Ranged | None:
    """The groups as templates over one loop index, or None when their numbers are not affine."""
    count = len(groups)
    # Every varying number: (group row, cell, run) -> its values over the groups.
    runs: dict[tuple[int, int, int], list[int]] = {}
    for j, row in enumerate(groups[0]):
        for c, cell in enumerate(row):
            if not isinstance(cell, str):
                if any(g[j][c] != cell for g in groups):
                    return None
                continue
            for r, _ in enumerate(DIGITS.finditer(cell)):
                values = [DIGITS.findall(g[j][c])[r] for g in groups]
                if len(set(values)) == 1:
                    continue
                if any(str(int(v)) != v for v in values):
                    return None               # leading zeros: not a number a format writes
                runs[(j, c, r)] = [int(v) for v in values]
    affine: dict[tuple[int, int, int], tuple[int, int]] = {}
    for key, values in runs.items():
        step = values[1] - values[0]
        if any(values[k] != values[0] + step * k for k in range(count)):
            return None
        affine[key] = (values[0], step)
    # The loop runs over the most common sequence (the layer index, usually); when some other
    # sequence does not move in multiples of its step, over the group number instead.
    a0, b0 = Counter(affine.values()).most_common(1)[0][0] if affine else (0, 1)
    if any(b % b0 for _, b in affine.values()):
        a0, b0 = 0, 1
    exprs: dict[tuple[int, int, int], str] = {}
    for key, (a, b) in affine.items():
        m = b // b0                  # value = m * i + c, with i = a0 + b0 * k
        exprs[key] = _affine(m, a - m * a0)
    rows = []
    for j, row in enumerate(groups[0]):
        cells = []
        for c, cell in enumerate(row):
            if not isinstance(cell, str):
                cells.append(literal(cell))
                continue
            cells.append(_format(cell, {r: e for (jj, cc, r), e in exprs.items() if (jj, cc) == (j, c)}))
        rows.append(tuple(cells))
    return Ranged(tuple(rows), _range(a0, b0, count))


def _affine(m: int, c: int) -> str:
    term = "i" if m == 1 else "-i" if m == -1 else f"{m} * i"
    if c == 0:
        return term
    if m == -1:
        return f"{c} - i"
    return f"{term} + {c}" if c > 0 else f"{term} - {-c}"


def _range(a0: int, b0: int, count: int) -> str:
    if b0 == 1:
        return f"range({count})" if a0 == 0 else f"range({a0}, {a0 + count})"
    return f"range({a0}, {a0 + b0 * count}, {b0})"


def _format(cell: str, holes: dict[int, str]) -> str:
    """``cell`` as Python source: a plain literal, or an f-string with ``holes`` (run -> expr)."""
    if not holes:
        return repr(cell)
    if HOLE.format("")[:1] in cell:
        raise ValueError("cannot template a cell holding the placeholder character")
    pieces, last = [], 0
    for r, match in enumerate(DIGITS.finditer(cell)):
        if r in holes:
            pieces.append(cell[last:match.start()].replace("{", "{{").replace("}", "}}"))
            pieces.append(HOLE.format(r))
            last = match.end()
    pieces.append(cell[last:].replace("{", "{{").replace("}", "}}"))
    source = "f" + repr("".join(pieces))
    for r, expr in holes.items():
        source = source.replace(HOLE.format(r), "{" + expr + "}")
    return source


# ---- rendering --------------------------------------------------------------------------------

def literal(value: Any) -> str:
    """``repr(value)``, but a long tuple of per-rank numbers as runs: ``(25,) * 128 + (20,) * 128``
    (256 ranks of two device kinds read as two numbers, not 256)."""
    if isinstance(value, tuple):
        if len(value) >= RUN_MIN_LENGTH and all(isinstance(x, (int, float)) for x in value):
            runs: list[list[Any]] = []
            for x in value:
                if runs and runs[-1][0] == x and type(runs[-1][0]) is type(x):
                    runs[-1][1] += 1
                else:
                    runs.append([x, 1])
            if len(runs) * 3 <= len(value):
                return " + ".join(f"({x!r},)" + (f" * {n}" if n > 1 else "") for x, n in runs)
        inner = ", ".join(literal(x) for x in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def render_dict(header: str, pairs: list[tuple[Any, Any]]) -> str:
    """``header = {...}``: ``pairs`` as key: value lines, repeated groups as ``**{...}``."""
    lines = []
    for item in compress([tuple(p) for p in pairs]):
        if isinstance(item, Ranged):
            if len(item.rows) == 1:
                key, value = item.rows[0]
                lines.append(f"    **{{{key}: {value} for i in {item.loop}}},")
            else:
                lines.append(f"    **{{key: value for i in {item.loop} for key, value in (")
                lines += [f"        ({key}, {value})," for key, value in item.rows]
                lines.append("    )},")
        else:
            lines.append(f"    {literal(item[0])}: {literal(item[1])},")
    source = _braced(header, "{", lines, "}")
    return source if _evaluates_to(source, dict(pairs)) else _plain_dict(header, pairs)


def render_tuple(header: str, values: list[Any]) -> str:
    """``header = (...)``: one value a line, repeated groups as ``*(...)``."""
    lines = []
    for item in compress([(v,) for v in values]):
        if isinstance(item, Ranged):
            if len(item.rows) == 1:
                lines.append(f"    *({item.rows[0][0]} for i in {item.loop}),")
            else:
                lines.append(f"    *(value for i in {item.loop} for value in (")
                lines += [f"        {row[0]}," for row in item.rows]
                lines.append("    )),")
        else:
            lines.append(f"    {item[0]!r},")
    source = _braced(header, "(", lines, ")")
    return source if _evaluates_to(source, tuple(values)) else _plain_tuple(header, values)


def render_rows(header: str, rows: list[tuple[str, ...]]) -> str:
    """``header = (...)``: a tuple of rows (tuples of names), wrapped; repeated rows as ``*(...)``."""
    lines = []
    for item in compress([tuple(r) for r in rows]):
        if isinstance(item, Ranged):
            if len(item.rows) == 1:
                lines += _wrapped("    *(", item.rows[0], f" for i in {item.loop}),")
            else:
                lines.append(f"    *(row for i in {item.loop} for row in (")
                for row in item.rows:
                    lines += ["    " + ln for ln in _wrapped("    ", row, ",")]
                lines.append("    )),")
        else:
            lines += _wrapped("    ", tuple(map(repr, item)), ",")
    source = _braced(header, "(", lines, ")")
    return source if _evaluates_to(source, tuple(tuple(r) for r in rows)) else \
        _braced(header, "(", [ln for r in rows for ln in _wrapped("    ", tuple(map(repr, r)), ",")], ")")


def _wrapped(lead: str, cells: tuple[str, ...], tail: str) -> list[str]:
    """``lead(cell, cell, ...)tail`` over as many lines as ``WIDTH`` needs."""
    inner = ", ".join(cells) + ("," if len(cells) == 1 else "")
    if len(lead) + len(inner) + len(tail) + 2 <= WIDTH:
        return [f"{lead}({inner}){tail}"]
    lines, line = [f"{lead}("], ""
    pad = " " * (len(lead) + 4)
    for cell in cells:
        if line and len(pad) + len(line) + len(cell) + 2 > WIDTH:
            lines.append(pad + line.rstrip())
            line = ""
        line += cell + ", "
    lines.append(pad + line.rstrip())
    lines.append(" " * len(lead) + ")" + tail)
    return lines


def _braced(header: str, opening: str, lines: list[str], closing: str) -> str:
    if not lines:
        return f"{header} = {opening}{closing}"
    return f"{header} = {opening}\n" + "\n".join(lines) + f"\n{closing}"


def _evaluates_to(source: str, want: Any) -> bool:
    expr = source.split(" = ", 1)[1]
    try:
        got = eval(expr, {"__builtins__": {"range": range}})   # noqa: S307  (our own generated text)
    except Exception:      # noqa: BLE001  (any failure means: write the rows out)
        return False
    return got == want and (not isinstance(want, dict) or list(got) == list(want))


def _plain_dict(header: str, pairs: list[tuple[Any, Any]]) -> str:
    return _braced(header, "{", [f"    {literal(k)}: {literal(v)}," for k, v in pairs], "}")


def _plain_tuple(header: str, values: list[Any]) -> str:
    return _braced(header, "(", [f"    {v!r}," for v in values], ")")
