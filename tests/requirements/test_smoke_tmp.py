from tests.conftest import INGEST, ADMIN
from scheduler.clock import ManualClock
from datetime import timedelta

def test_smoke(client, service, clock: ManualClock):
    r = client.post("/admin/scheduled-events", headers=INGEST, json={
        "event_type": "reminder", "user_id": "u1", "trigger_at": "2026-11-30T10:00:00+00:00",
        "facts": {"facts_version": "1", "scenario": "commitment_reminder", "date": "2026-11-30", "commitment": "run the dishwasher at noon"}})
    assert r.status_code == 201, r.text
    clock.advance(timedelta(hours=2))
    rep = service.scheduler.poll_once()
    assert rep.dispatched == 1, rep
    r = client.get("/admin/notifications", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()[0]["status"] == "sent", r.json()
    print(r.json())
    assert client.get("/openapi.json").status_code == 200
