"""Regenerate docs/api.md's per-route table from /openapi.json: ``python -m tests.contract.api_doc``.

Rows already in the page keep their hand-written "when" column; new answers get the
description from /openapi.json. tests/contract/test_responses.py checks the result.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from scheduler.web.api.openapi import openapi_document

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
HEADER = "| route | status | body | when |\n| --- | --- | --- | --- |\n"
_ROW = re.compile(r"^\| `((?:GET|POST|PUT|PATCH|DELETE) \S+)` \| (\d{3}) \| [^|]+ \| (.+) \|$", re.M)


def body_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "items" in schema:
        return f"[{body_name(schema['items'])}]"
    if "anyOf" in schema:
        return " or ".join(body_name(s) for s in schema["anyOf"])
    return f"JSON {schema.get('type', 'value')}"


def declared(document: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(route, status, body model, description) of every answer the document declares."""
    rows = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in sorted(operation["responses"].items()):
                content = response.get("content", {})
                if "application/json" in content:
                    body = body_name(content["application/json"].get("schema", {}))
                else:
                    body = ", ".join(content) or "(no body)"
                rows.append((f"{method.upper()} {path}", status, body, str(response["description"])))
    return rows


def main() -> None:
    logging.disable(logging.WARNING)
    service = SchedulerService(Settings(jwt_secret="x" * 40), engine=create_engine("postgresql+psycopg://docs@/none"),
                               clock=ManualClock(datetime.now(UTC)), run_scheduler=False)
    page = API_DOC.read_text()
    known = {(route, status): when for route, status, when in _ROW.findall(page)}
    lines = [f"| `{route}` | {status} | {body} | {known.get((route, status), description)} |"
             for route, status, body, description in declared(openapi_document(service.app.routes))]
    head = page[: page.index(HEADER)]
    API_DOC.write_text(head + HEADER + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
