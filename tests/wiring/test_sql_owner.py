"""ARCH-6: the SQL has one owner, the service's ``Database`` (DEC-DB): the web edge and the
decision run none of their own.

``scheduler.web`` and ``scheduler.nudging`` are read with ``ast``: neither imports what runs SQL
(the statements' loader, the pipeline, the migrations, SQLAlchemy's ``text``) nor calls it
(``statement``, ``text``, ``execute``, ``exec_driver_sql``, ``send``); they call the methods of
the repositories the ``Database`` they are handed holds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "scheduler"
EDGES = ("web", "nudging")
# Modules that run SQL, or hand out what does.
SQL_MODULES = ("scheduler.database.queries", "scheduler.database.pipeline", "scheduler.database.schema",
               "sqlalchemy.sql")
# Names that run SQL, or build a statement to run, wherever they are imported from.
SQL_NAMES = {"text", "statement", "TextClause", "Statements", "database_time", "send", "load_queries", "sql"}
# Calls that run SQL on a session or a connection.
SQL_CALLS = {"execute", "exec_driver_sql", "statement", "text", "send", "scalar", "scalars"}
# The deprecated forwarding modules at the old paths (``web/<name>.py``, ARCH-3) import nothing but
# their new module.


def _modules(package: str) -> list[Path]:
    root = SRC / package
    return sorted(p for p in root.rglob("*.py") if not (package == "web" and p.parent == root and p.name != "app.py"
                                                        and p.name != "__init__.py"))


def sql_uses(path: Path) -> list[str]:
    """What in ``path`` runs SQL or imports what does: one line per finding."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith(SQL_MODULES):
                found.append(f"line {node.lineno}: imports {node.module}")
            found.extend(f"line {node.lineno}: imports {alias.name} from {node.module}" for alias in node.names
                         if alias.name in SQL_NAMES and node.module.split(".")[0] in {"scheduler", "sqlalchemy"})
        elif isinstance(node, ast.Import):
            found.extend(f"line {node.lineno}: imports {alias.name}" for alias in node.names
                         if alias.name.startswith(SQL_MODULES))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in SQL_CALLS:
                found.append(f"line {node.lineno}: calls {name}()")
    return found


@pytest.mark.clause("DEC-DB")
@pytest.mark.clause("ARCH-6")
@pytest.mark.parametrize("package", EDGES)
def test_the_web_edge_and_the_decision_import_nothing_that_runs_sql_and_call_no_statement(package: str) -> None:
    """ARCH-6: no module of ``scheduler.web`` or ``scheduler.nudging`` imports the statements,
    the pipeline, the migrations or SQLAlchemy's ``text``, nor calls ``execute``, ``statement``,
    ``text`` or ``send``: what they read and write goes through a repository of the Database."""
    offenders = {str(path.relative_to(SRC)): uses for path in _modules(package) if (uses := sql_uses(path))}
    assert offenders == {}


@pytest.mark.clause("ARCH-6")
def test_the_sql_check_finds_a_statement_run_at_the_edge(tmp_path: Path) -> None:
    """ARCH-6: the check is not vacuous: a route that runs a statement of its own is named."""
    route = tmp_path / "route.py"
    route.write_text("from sqlalchemy import text\n"
                     "from scheduler.database.queries import Statements\n"
                     "def read(session):\n"
                     "    return session.execute(text('SELECT 1')).scalar_one()\n")
    assert sql_uses(route) == ["line 1: imports text from sqlalchemy", "line 2: imports scheduler.database.queries",
                               "line 2: imports Statements from scheduler.database.queries", "line 4: calls execute()",
                               "line 4: calls text()"]
