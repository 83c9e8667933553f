"""REL-19, REL-21: the webhook provider down under load, then back (``python -m reliability
provider-down``), small, as CI runs every scenario (REL-17).

Two real ``scheduler serve`` replicas send their outbox to the scenario's receiver, which
refuses connections and then answers 503 for a few seconds while a second backlog is stored;
the full-size run (60 s down, 2,000 events) and its figures are in docs/reliability.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.scenarios import run_small_scenario


@pytest.mark.clause("REL-17")
@pytest.mark.clause("REL-19")
@pytest.mark.clause("REL-21")
def test_a_provider_down_under_load_loses_no_delivery_and_the_backlog_drains_with_backoff(tmp_path: Path) -> None:
    """REL-19: every sent notification's webhook is delivered once the provider is back, each
    key accepted by the receiver, none given up; REL-21: during the outage rows went
    ``retrying`` and counted their attempts, at a few requests per waiting row, not one a second."""
    run = run_small_scenario("provider-down", ["--seed", "3", "--events", "200", "--down-seconds", "4",
                                               "--backoff-seconds", "0.5", "--backoff-cap-seconds", "2"],
                             tmp_path, timeout=300)
    figures = run.figures
    assert figures["sent_notifications"] == figures["webhook_rows"] == figures["delivered"] > 0, run.output()
    assert figures["undeliverable"] == figures["stuck"] == figures["bad_signatures"] == 0, run.output()
    assert figures["retrying_at_most_during_outage"] > 0 and figures["retried_rows"] > 0, run.output()
    assert figures["requests_503"] > 0 and figures["refused_attempts"] > 0, run.output()
    assert figures["attempts_max"] > 1, run.output()
