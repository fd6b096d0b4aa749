"""A value a user's query builds may not outgrow a row, checked before DuckDB builds it.

DuckDB's memory limit does not cover the value a scalar function returns: it
is allocated beside the buffer manager.  ``SELECT repeat('x', 1e9)`` took the
tracer from 375 MiB to 4.2 GiB of RSS (refused only afterwards, by the row
check of store/query.py), ``len(range(1e8))`` to 7.3 GiB, a ``list_reduce``
doubling a string to 5.2 GiB.  What DuckDB spills or tracks (aggregates such
as string_agg and list, sorts, joins, a CTE or subquery's rows) stays under
its memory limit and is not checked here.

So the functions whose result can be larger than their arguments by a factor
an argument sets are rewritten, before the statement runs, with the size of
their result predicted from their arguments and refused (DuckDB's error())
when it is over the budget:

- builders: repeat, lpad/rpad, range/generate_series as a value (not in
  FROM, where rows stream), list_resize/array_resize, bitstring, to_base,
  equi_width_bins, printf/format (their widths), replace and regexp_replace;
- lambdas over a list: a transform's or filter's body gets the budget divided
  by the list's length, and a transform's element and a reduce's
  accumulator are checked against it, so the list or the accumulator never
  outgrows the budget.

The guard wraps one argument in ``CASE WHEN <predicted> > <budget> THEN
error(...) ELSE <argument> END``: the argument's own type is kept, and DuckDB
evaluates the check before the function, also when it folds constants while
planning.  The rewrite works on the statement's text, at the places DuckDB's
own parser gives (json_serialize_sql); the rewritten statement is parsed
again and must be the original plus the guards, else the query is refused:
a statement is never run changed in any other way.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import duckdb

from ingero.errors import IngeroError

MARK = "ingero: value cap"  # the error text of every guard (also how the check finds them)
_NO_LOCATION = 2**64 - 1
# A guard repeats its arguments' text (once to predict, once as the value): calls nested deep
# would make the statement grow as 3^depth.  Past this many bytes the query is refused.
MAX_REWRITTEN_BYTES = 1 << 20


def _size(text: str) -> str:
    """SQL for the bytes of a value of any type (its text form: strings as they are)."""
    return f"coalesce(strlen(CAST(({text}) AS VARCHAR)), 0)::DOUBLE"


def _num(text: str) -> str:
    return f"TRY_CAST(({text}) AS DOUBLE)"


def _range_count(a: list[str]) -> str:
    """Elements of range/generate_series(a), (a, b), (a, b, step): numbers, or timestamps by an interval."""
    if len(a) == 1:
        return f"abs({_num(a[0])})"
    start, stop = a[0], a[1]
    step_num = _num(a[2]) if len(a) == 3 else "1"
    nums = f"({_num(stop)} - {_num(start)}) / nullif({step_num}, 0)"
    if len(a) < 3:
        return f"abs({nums})"
    times = (f"(epoch(TRY_CAST(({stop}) AS TIMESTAMP)) - epoch(TRY_CAST(({start}) AS TIMESTAMP))) "
             f"/ nullif(epoch(TRY_CAST(({a[2]}) AS INTERVAL)), 0)")
    return f"abs(coalesce({nums}, {times}))"


def _widths(fmt: str) -> str:
    """The widest field a printf/format string asks for ('*' takes it from an argument: unbounded)."""
    return (f"(coalesce(list_max(CAST(regexp_extract_all(({fmt}), '[0-9]+') AS DOUBLE[])), 0) "
            f"+ CASE WHEN contains(({fmt}), '*') THEN 1e18 ELSE 0 END)")


# name -> (argument counts it takes, the argument the guard wraps, predicted bytes from the arguments' texts)
BUILDERS: dict[str, tuple[tuple[int, ...], int, Callable[[list[str]], str]]] = {
    "repeat": ((2,), 1, lambda a: f"{_size(a[0])} * {_num(a[1])}"),
    "lpad": ((3,), 1, lambda a: f"4 * {_num(a[1])}"),  # characters, up to 4 bytes each
    "rpad": ((3,), 1, lambda a: f"4 * {_num(a[1])}"),
    "range": ((1, 2, 3), -1, lambda a: f"8 * {_range_count(a)}"),
    "generate_series": ((1, 2, 3), -1, lambda a: f"8 * {_range_count(a)}"),
    "list_resize": ((2, 3), 1, lambda a: f"(8 + {_size(a[2]) if len(a) == 3 else 0}) * {_num(a[1])}"),
    "array_resize": ((2, 3), 1, lambda a: f"(8 + {_size(a[2]) if len(a) == 3 else 0}) * {_num(a[1])}"),
    "bitstring": ((2,), 1, lambda a: f"{_num(a[1])} / 8"),
    "to_base": ((3,), 2, lambda a: _num(a[2])),
    "equi_width_bins": ((4,), 2, lambda a: f"8 * {_num(a[2])}"),
    "printf": (tuple(range(1, 101)), 0, lambda a: _widths(a[0])),
    "format": (tuple(range(1, 101)), 0, lambda a: _widths(a[0])),
    "replace": ((3,), 2, lambda a: f"({_size(a[0])} + 1) * greatest({_size(a[2])}, 1)"),
    "regexp_replace": ((3, 4), 2, lambda a: f"({_size(a[0])} + 1) * greatest({_size(a[2])}, 1)"),
}
# name -> (the list argument, the lambda argument, how the body's result is bounded)
#   "each": the body runs once per element, a result element may take budget/len (transform)
#   "test": once per element, its result is a boolean (filter)
#   "whole": its result is the accumulator (reduce) or the value (invoke), bounded by the budget
LAMBDAS: dict[str, tuple[int | None, int, str]] = {
    **{n: (0, 1, "each") for n in ("list_transform", "array_transform", "apply", "list_apply", "array_apply")},
    **{n: (0, 1, "test") for n in ("list_filter", "array_filter", "filter")},
    **{n: (0, 1, "whole") for n in ("list_reduce", "array_reduce", "reduce")},
    "invoke": (None, 0, "whole"),
}
_SCHEMAS = ("", "main", "system", "pg_catalog")


class Unbounded(Exception):
    """The statement could not be rewritten faithfully (a call DuckDB's parser places oddly)."""


def _guard(check: str, value: str, what: str) -> str:
    what = what.replace("'", "''")
    return f"(CASE WHEN ({check}) THEN error('{MARK}: {what} would build a value too large') ELSE ({value}) END)"


def refusal(message: str, budget_bytes: int) -> str | None:
    """The one line for a guard's error (DuckDB's text of it), or None when ``message`` is another error."""
    at = message.find(MARK + ": ")
    if at < 0:
        return None
    what = message[at + len(MARK) + 2:].removesuffix(" would build a value too large")
    return (f"refused: {what} would build a value larger than {budget_bytes >> 20} MiB "
            "(the most one row of a result may hold), before it is built")


def _is_node(n: Any) -> bool:
    return isinstance(n, dict) and "class" in n


def _function_args(n: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if "arguments" in n:
        return [(a.get("name") or "", a["expression"]) for a in n["arguments"]]
    return [("", c) for c in n.get("children", [])]


def _interesting(n: dict[str, Any]) -> bool:
    if n.get("class") != "FUNCTION" or (n.get("schema") or "").lower() not in _SCHEMAS:
        return False
    name = (n.get("function_name") or "").lower()
    if name in LAMBDAS:
        return True
    return name in BUILDERS and len(_function_args(n)) in BUILDERS[name][0]


def _find(obj: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The interesting calls in ``obj`` not inside another one (that one renders them)."""
    if isinstance(obj, dict):
        if _is_node(obj) and _interesting(obj):
            out.append(obj)
            return out
        for k, v in obj.items():
            if k == "function" and obj.get("type") == "TABLE_FUNCTION" and isinstance(v, dict):
                for _, arg in _function_args(v):  # FROM range(...) streams its rows: only its arguments
                    _find(arg, out)
                continue
            _find(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _find(v, out)
    return out


def _span(obj: Any) -> tuple[int, int] | None:
    """Bytes of the statement an expression covers: its own place and all its parts' (a method call's
    place leaves out its receiver; an operator's, its operands)."""
    lo, hi = None, None

    def walk(o: Any) -> None:
        nonlocal lo, hi
        if isinstance(o, dict):
            loc, length = o.get("query_location"), o.get("query_location_length")
            if isinstance(loc, int) and loc != _NO_LOCATION and isinstance(length, int) and length > 0:
                lo = loc if lo is None else min(lo, loc)
                hi = loc + length if hi is None else max(hi, loc + length)
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(obj)
    return None if lo is None else (lo, hi)


class _Rewriter:
    def __init__(self, src: bytes) -> None:
        self.src = src
        self.guards = 0

    def text(self, lo: int, hi: int) -> str:
        return self.src[lo:hi].decode()

    def render(self, lo: int, hi: int, nodes: list[dict[str, Any]], budget: str) -> str:
        """src[lo:hi] with each interesting call in ``nodes`` rendered with its guard."""
        parts, pos = [], lo
        for n in sorted(nodes, key=lambda n: self.span(n)[0]):
            a, b = self.span(n)
            if a < pos or b > hi:
                raise Unbounded(f"{n.get('function_name')}() overlaps another expression")
            parts.append(self.text(pos, a))
            parts.append(self.call(n, budget))
            pos = b
        parts.append(self.text(pos, hi))
        return "".join(parts)

    def span(self, n: Any) -> tuple[int, int]:
        s = _span(n)
        if s is None:
            raise Unbounded("an expression has no place in the statement")
        return s

    def expr(self, n: dict[str, Any], budget: str) -> str:
        lo, hi = self.span(n)
        return self.render(lo, hi, _find(n, []), budget)

    def call(self, n: dict[str, Any], budget: str) -> str:
        name = n["function_name"]
        args = _function_args(n)
        key = name.lower()
        if key in LAMBDAS:
            texts = self.lambda_args(key, args, budget)
        else:
            texts = [self.expr(a, budget) for _, a in args]
            _, which, predict = BUILDERS[key]
            k = which % len(texts)
            texts[k] = _guard(f"{predict(texts)} > {budget}", texts[k], f"{name}()")
            self.guards += 1
        out = f"{name}(" + ", ".join(f"{an} := {t}" if an else t for (an, _), t in zip(args, texts)) + ")"
        if len(out) > MAX_REWRITTEN_BYTES:
            raise Unbounded(f"{name}() calls nested too deep")
        return out

    def lambda_args(self, key: str, args: list[tuple[str, dict[str, Any]]], budget: str) -> list[str]:
        list_at, lambda_at, kind = LAMBDAS[key]
        texts: list[str | None] = [None] * len(args)
        if lambda_at >= len(args) or args[lambda_at][1].get("class") != "LAMBDA":
            return [self.expr(a, budget) for _, a in args]  # not the lambda form: nothing to bound
        for i, (_, a) in enumerate(args):
            if i != lambda_at:
                texts[i] = self.expr(a, budget)
        lam = args[lambda_at][1]
        body = lam["expr"]
        inner = budget
        length = None
        if list_at is not None and list_at < len(args) and kind in ("each", "test"):
            self.check_no_shadowing(lam, args[list_at][1])
            length = f"greatest(len(({texts[list_at]})), 1)"
            inner = f"(({budget}) / {length})"
        body_text = self.expr(body, inner)
        if kind == "each":
            body_text = _guard(f"{_size(body_text)} * {length} > {budget}", body_text, f"an element of {key}()")
            self.guards += 1
        elif kind == "whole":
            body_text = _guard(f"{_size(body_text)} > {budget}", body_text, f"the result of {key}()")
            self.guards += 1
        lam_lo, lam_hi = self.span(lam)
        body_lo, body_hi = self.span(body)
        texts[lambda_at] = self.text(lam_lo, body_lo) + f"({body_text})" + self.text(body_hi, lam_hi)
        return [t for t in texts if t is not None]

    @staticmethod
    def check_no_shadowing(lam: dict[str, Any], lst: dict[str, Any]) -> None:
        """The body reads the list's length by the list's own expression: a lambda parameter of the
        same name as a column that expression uses would read another value."""
        params = {c for n in _nodes(lam.get("lhs")) if n.get("class") == "COLUMN_REF" for c in n["column_names"]}
        used = {c for n in _nodes(lst) if n.get("class") == "COLUMN_REF" for c in n["column_names"]}
        if params & used:
            raise IngeroError(f"refused: the lambda's parameter {sorted(params & used)[0]!r} has the name of a "
                              "column its list uses", "rename the lambda's parameter")


def _nodes(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            if _is_node(o):
                out.append(o)
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(obj)
    return out


def _ast(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(con.execute("SELECT json_serialize_sql($q)", {"q": sql}).fetchone()[0])
    except duckdb.InterruptException:
        raise  # an interrupted query is reported as interrupted, not run unbounded
    except (duckdb.Error, ValueError, TypeError):
        return None
    if doc.get("error") or len(doc.get("statements") or []) != 1:
        return None
    return doc["statements"][0]


_PLACE_KEYS = ("query_location", "query_location_length")


def _without_guards(obj: Any) -> Any:
    """The AST with every guard replaced by the argument it wraps, and places dropped."""
    if isinstance(obj, list):
        return [_without_guards(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if obj.get("class") == "CASE" and len(obj.get("case_checks") or []) == 1:
        then = obj["case_checks"][0].get("then_expr") or {}
        args = _function_args(then) if then.get("class") == "FUNCTION" else []
        if (then.get("function_name") == "error" and len(args) == 1
                and str((args[0][1].get("literal") or {}).get("text", args[0][1].get("value", ""))).startswith(MARK)):
            return _without_guards(obj["else_expr"])
    return {k: _without_guards(v) for k, v in obj.items() if k not in _PLACE_KEYS}


def bound_values(con: duckdb.DuckDBPyConnection, sql: str, budget_bytes: int) -> str:
    """``sql`` (one SELECT) with every value-building call guarded; unchanged when it has none."""
    ast = _ast(con, sql)
    if ast is None:
        return sql  # not one statement DuckDB can serialise (DESCRIBE, SHOW): the row check still holds
    nodes = _find(ast, [])
    if not nodes:
        return sql
    src = sql.encode()
    rw = _Rewriter(src)
    try:
        out = rw.render(0, len(src), nodes, str(int(budget_bytes)))
    except (Unbounded, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise IngeroError(f"refused: the size of the values this query builds cannot be checked ({exc})",
                          "write calls such as repeat(x, n) in their plain form") from None
    if rw.guards == 0:
        return sql
    again = _ast(con, out)
    if again is None or _without_guards(again) != _without_guards(ast):
        raise IngeroError("refused: the size of the values this query builds cannot be checked",
                          "write calls such as repeat(x, n) in their plain form")
    return out
