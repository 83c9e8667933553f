"""A host's own facts contract (DEC-FACTS-CONTRACT): ``SchedulerService(facts_contract=...)``
replaces the built-in one for the POST, the batch route, the import and ``scheduler.schedule``,
and a refusal is a 422 shaped like every other (``detail`` and ``errors``, each field named)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

import scheduler
from scheduler.cli import main
from scheduler.config import Settings
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.conftest import INGEST, T0, TEST_SECRET
from tests.helpers import rows

HOST_FACTS = {"commitment": "walk the dog", "minutes": 20}  # no facts_version, no scenario


class ReminderFacts(BaseModel):
    """A host's contract: a commitment and how long it takes."""

    model_config = ConfigDict(extra="allow")

    commitment: str
    minutes: int


def reminder_facts_check(facts: Mapping[str, Any]) -> None:
    """The same contract as a callable: a ``ValueError`` is its refusal."""
    if not isinstance(facts.get("commitment"), str):
        raise ValueError("a reminder names its commitment")


def _body(facts: Any, **fields: Any) -> dict[str, Any]:
    return {"event_type": "host_reminder", "user_id": "participant-1", "trigger_at": T0.isoformat(),
            "facts": facts, **fields}


@pytest.fixture(params=[ReminderFacts, reminder_facts_check], ids=["pydantic_model", "callable"])
def contract_service(request: pytest.FixtureRequest, engine: Engine) -> Iterator[SchedulerService]:
    yield SchedulerService(Settings(jwt_secret=TEST_SECRET), engine=engine, clock=ManualClock(T0),
                           run_scheduler=False, facts_contract=request.param)


def _is_shaped_like_the_other_422s(body: dict[str, Any], field: str) -> None:
    assert isinstance(body["detail"], str) and body["errors"]
    assert all(set(e) == {"field", "message"} for e in body["errors"])
    assert field in [e["field"] for e in body["errors"]], body


@pytest.mark.clause("DEC-FACTS-CONTRACT")
def test_the_hosts_contract_replaces_the_built_in_one_for_the_post_and_its_refusal_is_shaped_like_the_others(
    contract_service: SchedulerService, engine: Engine,
) -> None:
    """DEC-FACTS-CONTRACT: facts without ``facts_version``/``scenario`` that honour the host's
    contract are stored (201); facts that break it are a 422 with ``detail`` and ``errors``
    naming the field, not ``invalid_facts_contract``."""
    field = "facts.commitment" if contract_service.facts_contract is ReminderFacts else "facts"
    with TestClient(contract_service.app) as client:
        stored = client.post("/admin/scheduled-events", headers=INGEST, json=_body(HOST_FACTS))
        refused = client.post("/admin/scheduled-events", headers=INGEST, json=_body({"minutes": 5}))
    assert stored.status_code == 201, stored.text
    assert stored.json()["facts"] == HOST_FACTS
    assert refused.status_code == 422
    _is_shaped_like_the_other_422s(refused.json(), field)
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 1


@pytest.mark.clause("DEC-FACTS-CONTRACT")
def test_the_batch_route_judges_each_item_by_the_hosts_contract(contract_service: SchedulerService) -> None:
    """DEC-FACTS-CONTRACT: in a batch the valid item is stored and the other refused with the
    single POST's 422 body."""
    with TestClient(contract_service.app) as client:
        answer = client.post("/admin/scheduled-events/bulk", headers=INGEST,
                             json=[_body(HOST_FACTS), _body({"minutes": 5})])
        single = client.post("/admin/scheduled-events", headers=INGEST, json=_body({"minutes": 5}))
    assert answer.status_code == 200, answer.text
    first, second = answer.json()
    assert first["status"] == 201 and second["status"] == 422
    assert second["error"] == single.json()


@pytest.mark.clause("DEC-FACTS-CONTRACT")
def test_schedule_judges_facts_by_the_hosts_contract(contract_service: SchedulerService, engine: Engine) -> None:
    """DEC-FACTS-CONTRACT: ``scheduler.schedule`` stores what the contract accepts and raises
    ``InvalidEvent`` naming the field for what it refuses."""
    with Session(engine) as session:
        scheduler.schedule(session, service=contract_service, event_type="host_reminder", user_id="p",
                           trigger_at=T0, facts=HOST_FACTS)
        with pytest.raises(scheduler.InvalidEvent) as refused:
            scheduler.schedule(session, service=contract_service, event_type="host_reminder", user_id="p",
                               trigger_at=T0, facts={"minutes": 5})
        session.commit()
    assert refused.value.errors[0]["field"].startswith("facts")
    assert len(rows(engine, "SELECT id FROM scheduled_events")) == 1


@pytest.mark.clause("DEC-FACTS-CONTRACT")
def test_the_import_judges_each_line_by_the_contract_it_is_given(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """DEC-FACTS-CONTRACT: ``scheduler events import --facts-contract module:name`` stores the
    line the host's contract accepts and refuses the other naming the field (exit 1); a name
    that cannot be loaded is one sentence and exit 2."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(_body(HOST_FACTS)) + "\n" + json.dumps(_body({"minutes": 5})) + "\n")
    code = main(["events", "import", "--facts-contract", f"{__name__}:ReminderFacts", str(path)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "stored 1, rewritten 0, refused 1" in out and "facts.commitment" in out
    assert main(["events", "import", "--facts-contract", "no_such_module:Facts", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--facts-contract 'no_such_module:Facts': cannot import no_such_module")
    assert err.count("\n") == 1
