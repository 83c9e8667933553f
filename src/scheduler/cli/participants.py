"""``scheduler participants preferences USER``: a participant's preferences, their time zone
and quiet hours with them (QUIET-1), as ``GET /admin/participants/{user_id}/preferences``
answers them; a thin adapter over ``scheduler.application.participants``."""

from __future__ import annotations

import argparse
import json

from scheduler.cli.arguments import text_argument
from scheduler.cli.serve import migrated_engine
from scheduler.cli.terminal import terminal_safe
from scheduler.config import Settings


def add_participants_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    participants = sub.add_parser("participants", help="a participant's preferences",
                                  description="Read what is stored about a participant.")
    participants_sub = participants.add_subparsers(dest="participants_command", required=True, metavar="ACTION")
    prefs = participants_sub.add_parser(
        "preferences", help="enabled kinds, daily cap, time zone and quiet hours",
        description="A participant's preferences (the defaults when none were set: every kind, a cap of 3, "
        "UTC, no quiet hours). Set them with PUT /admin/participants/{user_id}/preferences.")
    prefs.add_argument("user_id", type=text_argument, help="the participant's user_id")
    prefs.add_argument("--json", action="store_true", help="print JSON, as the API answers")
    prefs.set_defaults(func=cmd_participants_preferences)


def cmd_participants_preferences(args: argparse.Namespace, settings: Settings) -> int:
    from scheduler.application.participants import get_preferences
    from scheduler.database.database import Database

    engine = migrated_engine(settings)
    try:
        row = get_preferences(Database(engine, settings.database_schema), args.user_id)
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    quiet = row["quiet_hours"]
    shown = {
        "user_id": row["user_id"],
        "enabled_kinds": "all" if row["enabled_kinds"] is None else ", ".join(row["enabled_kinds"]) or "none",
        "max_per_day": row["max_per_day"],
        "time_zone": row["time_zone"],
        "quiet_hours": "none" if quiet is None else f"{quiet['start']} to {quiet['end']} local",
        "updated_at": row["updated_at"] or "never set (the defaults)",
    }
    width = max(len(k) for k in shown)
    for key, value in shown.items():
        print(terminal_safe(f"{key:<{width}}  {value}"))
    return 0
