"""EMB-21: the published OpenAPI document describes the service's own facts contract.

With ``SchedulerService(facts_contract=...)`` the bodies' ``facts`` (the POST's, the batch's
items, the live route's) are described by the host's contract: a pydantic model's JSON schema,
among the components and referenced, or an object judged by a callable (named, with its
docstring's first line); ``facts`` is no longer required by the schema (absent facts are
given to the contract as an empty object), and the facts 422s say what a refusal looks like.
The same in the service's own ``/openapi.json`` and in a FastAPI host's merged document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema_rs
import pytest
from pydantic import BaseModel
from schemathesis.specs.openapi.definitions import OPENAPI_31
from starlette.testclient import TestClient

from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.web.app import SchedulerService
from tests.conftest import T0, TEST_SECRET

pytest.importorskip("fastapi", reason="FastAPI is a test dependency (the merged document)")


class CommitmentFacts(BaseModel):
    """A commitment and how long it takes."""

    commitment: str
    minutes: int


def commitment_check(facts: Mapping[str, Any]) -> None:
    """A reminder names its commitment."""
    if not isinstance(facts.get("commitment"), str):
        raise ValueError("a reminder names its commitment")


def _document(contract: Any) -> dict[str, Any]:
    service = SchedulerService(Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:9/none",
                                        jwt_secret=TEST_SECRET),
                               clock=ManualClock(T0), run_scheduler=False, facts_contract=contract)
    document: dict[str, Any] = TestClient(service.app_for("api")).get("/openapi.json").json()
    return document


def _valid(document: dict[str, Any]) -> None:
    assert [e.message for e in jsonschema_rs.validator_for(OPENAPI_31).iter_errors(document)] == []
    schemas = document["components"]["schemas"]
    assert [name for name, schema in schemas.items() if not jsonschema_rs.meta.is_valid(schema)] == []


@pytest.mark.clause("EMB-21")
def test_a_pydantic_contract_is_the_schema_of_facts_in_the_services_document() -> None:
    """EMB-21: ``facts`` refers to the model's own schema (a component of the document), not
    to ``facts_version`` and ``scenario``, is not required by the schema, and the 422 of the
    POST says the contract's refusal; without a contract the built-in one is still described."""
    document = _document(CommitmentFacts)
    _valid(document)
    schemas = document["components"]["schemas"]
    assert schemas["CommitmentFacts"]["required"] == ["commitment", "minutes"]
    for body in ("ScheduledEventIn", "LiveEventIn"):
        facts = schemas[body]["properties"]["facts"]
        assert facts["$ref"] == "#/components/schemas/CommitmentFacts", facts
        assert "CommitmentFacts: A commitment and how long it takes." in facts["description"]
        assert "facts" not in schemas[body].get("required", [])
    post = document["paths"]["/admin/scheduled-events"]["post"]["responses"]["422"]["description"]
    assert post.startswith("facts refused by the service's facts contract") and "facts_version" not in post
    built_in = _document(None)
    facts = built_in["components"]["schemas"]["ScheduledEventIn"]["properties"]["facts"]
    assert facts["required"] == ["facts_version", "scenario"]  # the literal default, unchanged
    assert "facts_version" in built_in["paths"]["/admin/scheduled-events"]["post"]["responses"]["422"]["description"]
    assert "CommitmentFacts" not in built_in["components"]["schemas"]


@pytest.mark.clause("EMB-21")
def test_a_callable_contract_makes_facts_an_object_judged_by_it() -> None:
    """EMB-21: a callable contract has no schema to publish: ``facts`` is an object, described
    by the callable's name and the first line of its docstring."""
    document = _document(commitment_check)
    _valid(document)
    facts = document["components"]["schemas"]["ScheduledEventIn"]["properties"]["facts"]
    assert facts["type"] == "object" and "required" not in facts and "properties" not in facts
    assert "commitment_check: A reminder names its commitment." in facts["description"]


@pytest.mark.clause("EMB-21")
def test_a_fastapi_hosts_merged_document_describes_its_contract_too() -> None:
    """EMB-21: ``include_in_fastapi`` merges the same description into the host's document."""
    from fastapi import FastAPI

    service = SchedulerService(Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:9/none",
                                        jwt_secret=TEST_SECRET),
                               clock=ManualClock(T0), run_scheduler=False, facts_contract=CommitmentFacts)
    host = FastAPI(title="host")
    service.include_in_fastapi(host, "/nudging", "api")
    document = TestClient(host).get("/openapi.json").json()
    _valid(document)
    facts = document["components"]["schemas"]["ScheduledEventIn"]["properties"]["facts"]
    assert facts["$ref"] == "#/components/schemas/CommitmentFacts"
    assert "CommitmentFacts" in document["components"]["schemas"]
