"""Every structured log line can be written: no ``extra`` field takes a name a ``LogRecord`` keeps for itself.

``logging`` raises ``KeyError`` for such a field at the moment the line is
logged, so the line's caller fails, and only where its level is enabled:
``backfill.run`` named a field ``created`` and the backfill endpoint answered
``500`` after its first batch in the web (which logs INFO), while the CLI and
the tests (which log less) passed (an adversarial review).
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESERVED = set(vars(logging.LogRecord("name", logging.INFO, "path", 1, "msg", None, None))) | {"message", "asctime"}


def extra_fields(tree: ast.AST):
    """(line, name) of each literal key of an ``extra={...}`` or ``extra=dict(...)`` keyword argument."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.keyword) or node.arg != "extra":
            continue
        if isinstance(node.value, ast.Dict):
            yield from ((node.value.lineno, key.value) for key in node.value.keys if isinstance(key, ast.Constant))
        elif isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "dict":
            yield from ((node.value.lineno, kw.arg) for kw in node.value.keywords if kw.arg)


def test_no_log_line_names_a_field_the_log_record_keeps():
    clashes = [f"{path.relative_to(REPO)}:{line}: {name}"
               for folder in ("app", "actors", "scheduler", "bench")
               for path in sorted((REPO / folder).rglob("*.py"))
               for line, name in extra_fields(ast.parse(path.read_text(), str(path)))
               if name in RESERVED]
    assert clashes == []


def test_the_check_sees_a_clash():
    tree = ast.parse('log.info("x", extra={"created": 1, "job_id": 2})\nlog.info("y", extra=dict(name=1))')
    assert [name for _, name in extra_fields(tree) if name in RESERVED] == ["created", "name"]
