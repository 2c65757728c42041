"""Named SQL queries, loaded once from `queries.sql`.

Queries are written for psycopg (`%(name)s` parameters). `to_positional` and
`to_sqlalchemy` rewrite a query for the other drivers the outbox write API
accepts (and `to_positional` for server-side PREPARE), so each statement
exists once.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PARAM = re.compile(r"%\((\w+)\)s")
_FRAGMENT = re.compile(r"\{(\w+)\}")


@cache
def queries() -> dict[str, str]:
    text = resources.files("seamq.pg").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    named = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2])}
    # `{other}` in a query is another named query's text: a condition two queries share is written once.
    return {name: _FRAGMENT.sub(lambda m: named[m[1]], body) for name, body in named.items()}


def query(name: str) -> str:
    return queries()[name]


def to_positional(sql: str) -> tuple[str, list[str]]:
    """`%(a)s ... %(b)s` -> (`$1 ... $2`, ["a", "b"]): asyncpg's form, and PREPARE's."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PARAM.sub(number, sql), names


def to_sqlalchemy(sql: str) -> str:
    """`%(a)s` -> `:a` (casts are written as CAST(...) so `::` never appears)."""
    return _PARAM.sub(r":\1", sql)
