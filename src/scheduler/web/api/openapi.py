"""The OpenAPI document, derived from the pydantic models and the mounted routes (each route's
documented operation is in ``scheduler.web.api.openapi_operations``)."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute, Route

from scheduler.web.api.openapi_operations import MODELS, OPERATIONS, model_ref
from scheduler.web.http.params import declared

if TYPE_CHECKING:
    from scheduler.nudging.facts import FactsContract


# The bodies whose ``facts`` a host's own facts contract judges (DEC-FACTS-CONTRACT).
FACTS_BODIES = ("ScheduledEventIn", "LiveEventIn")
HOST_FACTS_REFUSED = ("facts refused by the service's facts contract ({detail, errors: [{field, message}]}, "
                      "a field of the contract's named facts.<path>), or any other malformed body, each field named")


def _host_facts(contract: FactsContract, schemas: dict[str, Any], ref: dict[str, Any] | None) -> None:
    """``facts`` of the bodies as the host's contract says: its model's schema (``ref``), or an
    object judged by its callable (named, with the first line of its docstring). Absent facts
    are given to the contract as an empty object, so the contract, not the schema, requires them."""
    name = getattr(contract, "__qualname__", type(contract).__qualname__)
    doc = (inspect.getdoc(contract) or "").strip().splitlines()
    said = f": {doc[0]}" if doc else ""
    if ref is not None:
        facts: dict[str, Any] = {**ref, "description": f"Validated by the service's facts contract, {name}{said}"}
    else:
        facts = {"type": "object", "description": f"Judged by the service's facts contract, {name}{said} "
                                                  "(an object; a refusal names facts)"}
    for body in FACTS_BODIES:
        schema = schemas.get(body)
        if schema is None:
            continue
        schema["properties"]["facts"] = facts
        schema["required"] = [field for field in schema.get("required", []) if field != "facts"]


def _contract_model(contract: FactsContract | None) -> type[BaseModel] | None:
    return contract if isinstance(contract, type) and issubclass(contract, BaseModel) else None


def openapi_document(routes: Sequence[BaseRoute], root_path: str = "",
                     facts_contract: FactsContract | None = None) -> dict[str, Any]:
    """OpenAPI 3.1 for the routes actually mounted (an undocumented route is an error).

    ``root_path`` is where the app is mounted (the ASGI ``root_path``): it becomes the
    ``servers`` entry, so the paths stay relative to the app and clients call the right URLs.
    ``facts_contract``, the service's own (DEC-FACTS-CONTRACT), is what the bodies' ``facts``
    are described by (a pydantic model's JSON schema among the components, or an object judged
    by a callable) instead of the built-in contract, and the facts 422s say so.
    """
    model = _contract_model(facts_contract)
    refs, definitions = models_json_schema(
        [(m, "validation" if m.__name__.endswith("In") else "serialization") for m in MODELS]
        + ([(model, "validation")] if model is not None else []),
        ref_template="#/components/schemas/{model}",
    )
    if facts_contract is not None:
        ref = dict(refs[(model, "validation")]) if model is not None else None
        _host_facts(facts_contract, definitions.setdefault("$defs", {}), ref)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route) or not route.include_in_schema:
            continue
        for method in sorted((route.methods or set()) - {"HEAD"}):
            key = (route.path_format, method.lower())
            if key not in OPERATIONS:
                raise KeyError(f"route {method} {route.path_format} has no OpenAPI description")
            spec = dict(OPERATIONS[key])
            operation: dict[str, Any] = {"summary": spec["summary"], "responses": spec["responses"]}
            if facts_contract is not None and "request" in spec and spec["request"].__name__ in FACTS_BODIES:
                responses = copy.deepcopy(spec["responses"])  # OPERATIONS is shared: never changed
                responses["422"]["description"] = HOST_FACTS_REFUSED + (
                    "; or the dispatcher refuses the live event" if key[0] == "/admin/ingest-event" else "")
                operation["responses"] = responses
            params = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in route.param_convertors
            ]
            # Query parameters from the endpoint's own declaration (scheduler.web.http.params):
            # what is validated is what is documented. Any other parameter is a 422.
            params += [
                {"name": name, "in": "query", "required": False, "schema": param.schema,
                 **({"description": param.description} if param.description else {})}
                for name, param in (declared(route.endpoint) or {}).items()
            ]
            params += [
                {"name": name, "in": "header", "required": False, "schema": schema}
                for name, schema in spec.get("headers", {}).items()
            ]
            if params:
                operation["parameters"] = params
            if "request" in spec:
                body_schema: dict[str, Any] = model_ref(spec["request"])
                if spec.get("request_many"):
                    body_schema = {"type": "array", "items": body_schema}
                operation["requestBody"] = {
                    "required": not spec.get("request_optional"),
                    "content": {"application/json": {"schema": body_schema}},
                }
            if route.path_format.startswith(("/admin", "/me")):
                operation["security"] = [{"bearer": []}]
            paths.setdefault(route.path_format, {})[method.lower()] = operation
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "scheduler", "version": "0.1.0",
                 "description": "Scheduled events for the nudging platform (REQ-0063 to REQ-0067)."},
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
    }
    if root_path.rstrip("/"):
        document["servers"] = [{"url": root_path.rstrip("/")}]
    return document


def merged_document(host: dict[str, Any], ours: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A host's OpenAPI 3.1 document with ``ours`` (the mounted parts' document) merged in: our
    paths under ``prefix`` (where the host mounts them), our component schemas and security
    scheme beside its own. The host's document is not changed; a path, schema or security scheme
    both define differently is a ``ValueError`` naming it (never one silently replacing the other)."""
    if not str(host.get("openapi", "")).startswith("3.1"):
        raise ValueError(f"the host's OpenAPI document is version {host.get('openapi')!r}; the scheduler's "
                         "paths can be merged into an OpenAPI 3.1 document only")
    merged = {**host, "paths": dict(host.get("paths") or {}),
              "components": {name: dict(section) for name, section in (host.get("components") or {}).items()}}
    base = prefix.rstrip("/")
    for path, operations in ours["paths"].items():
        full = base + path
        if full in merged["paths"]:
            raise ValueError(f"the host's OpenAPI document already has the path {full}, which the scheduler "
                             f"mounted at {base or '/'} serves")
        merged["paths"][full] = operations
    for section, entries in ours["components"].items():
        into = merged["components"].setdefault(section, {})
        for name, entry in entries.items():
            if name in into and into[name] != entry:
                raise ValueError(f"the host's OpenAPI document defines components.{section}.{name} otherwise "
                                 "than the scheduler's: rename the host's")
            into[name] = entry
    return merged
