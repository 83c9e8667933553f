"""SEC-9: production mode refuses to start insecurely; development mode says so loudly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import Engine

from scheduler.cli import main
from scheduler.config import ConfigError, Settings
from scheduler.core.clock import ManualClock
from scheduler.service import SchedulerService
from tests.security.support import public_pem

STRONG_SECRET = "Zq8kL2pW9xR4mN7bV1cT6hY3jF5gD0aS-uE_iO"  # 38 characters, no weak marker


def _start(settings: Settings, engine: Engine, clock: ManualClock) -> SchedulerService:
    return SchedulerService(settings, engine=engine, clock=clock, run_scheduler=False)


@pytest.mark.clause("SEC-9")
def test_production_refuses_to_start_without_a_way_to_verify_tokens(
    engine: Engine, clock: ManualClock, tmp_path: Path
) -> None:
    """SEC-9: no secret, no public key, no JWKS URL: a ConfigError naming the variables."""
    settings = Settings(environment="production", jwt_secret=None, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="SCHEDULER_JWT_SECRET, SCHEDULER_JWT_PUBLIC_KEY or SCHEDULER_JWKS_URL"):
        _start(settings, engine, clock)


@pytest.mark.clause("SEC-9")
def test_production_refuses_the_generated_development_secret(
    engine: Engine, clock: ManualClock, tmp_path: Path
) -> None:
    """SEC-9: the secret `serve` generated into the data directory is a development convenience only."""
    settings = Settings(environment="production", jwt_secret=None, data_dir=tmp_path)
    settings.secret_file.write_text(STRONG_SECRET)
    with pytest.raises(ConfigError, match="generated development secret"):
        _start(settings, engine, clock)
    # the same data directory is fine in development
    assert _start(settings.with_(environment="development"), engine, clock).verifier.configured


@pytest.mark.clause("SEC-9")
@pytest.mark.parametrize(
    "secret",
    [
        "short-but-random-Q7x",  # under 32 characters
        "dev-" + STRONG_SECRET,
        "my-TEST-key-" + STRONG_SECRET,
        "secret" + STRONG_SECRET,
        "changeme" + STRONG_SECRET,
        "ab" * 20,  # long but two distinct characters
    ],
)
def test_production_refuses_development_grade_secrets(
    engine: Engine, clock: ManualClock, tmp_path: Path, secret: str
) -> None:
    """SEC-9: a short, repetitive or obviously non-production secret is refused."""
    settings = Settings(environment="production", jwt_secret=secret, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="development-grade SCHEDULER_JWT_SECRET"):
        _start(settings, engine, clock)


@pytest.mark.clause("SEC-9")
def test_production_starts_with_a_strong_secret_or_a_public_key(
    engine: Engine, clock: ManualClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SEC-9: the controls: a strong secret, or an RSA public key, start without a development warning."""
    with caplog.at_level(logging.WARNING, logger="scheduler.service.policy"):
        _start(Settings(environment="production", jwt_secret=STRONG_SECRET, data_dir=tmp_path), engine, clock)
        _start(Settings(environment="production", jwt_public_key=public_pem(), data_dir=tmp_path), engine, clock)
    assert "DEVELOPMENT" not in caplog.text


@pytest.mark.clause("SEC-9")
@pytest.mark.parametrize("generated_secret_present", [False, True])
def test_serve_in_production_without_a_key_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    database_url: str,
    generated_secret_present: bool,
) -> None:
    """SEC-9: `scheduler serve` with SCHEDULER_ENV=production and no key exits 2 before serving."""
    for name in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_PUBLIC_KEY", "SCHEDULER_JWKS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCHEDULER_ENV", "production")
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", database_url)
    if generated_secret_present:
        (tmp_path / "jwt-secret").write_text(STRONG_SECRET)
    assert main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: production mode needs SCHEDULER_JWT_SECRET" in err


@pytest.mark.clause("SEC-9")
def test_development_mode_warns_loudly(
    engine: Engine, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """SEC-9: without SCHEDULER_ENV=production the service logs that it runs in development mode."""
    with caplog.at_level(logging.WARNING, logger="scheduler.service.policy"):
        _start(Settings.from_env({"SCHEDULER_JWT_SECRET": "dev"}), engine, clock)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("DEVELOPMENT mode" in r.getMessage() for r in warnings)
