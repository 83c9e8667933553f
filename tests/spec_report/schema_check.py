"""A small JSON Schema validator: the keywords report.schema.json uses, and no others.

``jsonschema`` is not among the suite's dependencies; this checks ``type``, ``const``,
``enum``, ``pattern``, ``minimum``, ``required``, ``properties``, ``additionalProperties``,
``items`` and local ``$ref`` (``#/$defs/...``), and refuses a schema using any other
keyword, so the schema cannot silently ask for more than is checked.
"""

from __future__ import annotations

import re
from typing import Any

KNOWN = {"$schema", "$id", "title", "description", "$defs", "type", "const", "enum", "pattern",
         "minimum", "required", "properties", "additionalProperties", "items", "$ref"}
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TYPES[name])


def validate(instance: Any, schema: dict[str, Any]) -> list[str]:
    """Every violation of ``schema`` by ``instance``, as ``path: what`` (empty: valid)."""
    errors: list[str] = []
    _check(instance, schema, schema, "$", errors)
    return errors


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]) -> None:
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"{path}: the schema uses keywords this validator does not check: {sorted(unknown)}")
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"{path}: only local #/$defs/ references are supported, not {ref}")
        _check(value, root["$defs"][ref.removeprefix("#/$defs/")], root, path, errors)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, name) for name in names):
            errors.append(f"{path}: {value!r:.60} is not of type {' or '.join(names)}")
            return
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r:.60} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r:.60} is not one of {schema['enum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: {value!r:.60} does not match {schema['pattern']}")
    if _is(value, "number") and "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value} is below {schema['minimum']}")
    if isinstance(value, dict):
        errors.extend(f"{path}: {name!r} is required" for name in schema.get("required", []) if name not in value)
        properties = schema.get("properties", {})
        for name, item in value.items():
            if name in properties:
                _check(item, properties[name], root, f"{path}.{name}", errors)
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: {name!r} is not a property the schema allows")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], root, f"{path}[{index}]", errors)
