"""ARCH-12: the composition root is ``scheduler.service``; the web app only mounts.

``SchedulerService`` builds the engines, the clock, the loop, the listener, the hooks after
each poll and the route modules, and runs the tasks in its lifespan; ``scheduler.web.app``
is handed the route modules' routes and mounts them (the parts, the apps, a FastAPI host's
document). Read from the source: the web app imports nothing that builds a part.
"""

from __future__ import annotations

import pytest
from starlette.routing import Route

from scheduler.service import SchedulerService
from scheduler.web.app import PARTS, WebApp, part_of
from tests.wiring.test_import_graph import import_graph

# What mounting needs: the observer that instruments each app, the authentication's error
# answer and the error handlers of the shared kit, and the document a FastAPI host merges.
MOUNTING = {"scheduler.observability.observer", "scheduler.web.http.auth", "scheduler.web.http.errors",
            "scheduler.web.api.openapi"}


@pytest.mark.clause("ARCH-12")
def test_the_web_app_imports_nothing_that_builds_a_part_of_the_service() -> None:
    """ARCH-12: ``scheduler.web.app`` imports only what mounting needs: no engine, database,
    clock, loop, decision, operations or delivery module, no route module and not the root."""
    assert import_graph()["scheduler.web.app"] == MOUNTING


@pytest.mark.clause("ARCH-12")
def test_the_service_builds_the_parts_and_hands_the_web_app_its_route_modules(
        service: SchedulerService) -> None:
    """ARCH-12: the root's web app mounts the root's route modules: every route of the service
    app comes from them, the console's last, and each app it builds names the service."""
    assert isinstance(service.web, WebApp)
    routes = service.app.routes
    handed = [route for source in service.web.sources for route in source()]
    assert [getattr(r, "path", None) for r in routes] == [
        getattr(r, "path", None) for r in [*handed, *service.console.routes]]
    assert {part_of(route) for route in routes} == set(PARTS)
    assert all(isinstance(r, Route) and r.include_in_schema is False for r in routes if part_of(r) == "console")
    assert service.app.state.service is service and service.app_for("api").state.service is service
