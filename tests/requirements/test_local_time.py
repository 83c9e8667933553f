"""LOCAL-1 to LOCAL-7 — a participant's own time: time zone, quiet hours, their calendar day.

In our words: a participant's zone is an IANA name, parsed strictly; quiet hours are a
local ``[start, end)`` each day that may wrap past midnight; a local date and time means the
first instant the participant's clock reads it or later (so a time skipped by a
spring-forward gap is the first instant after the gap, and one a fall-back repeats its first
occurrence); the participant's day runs from one such midnight to the next. The module is
pure: every function takes its instant, so these tests need neither a database nor a clock.

The properties run over every zone of the installed tz database plus the odd ones by name
(+14:00, -11:00, +05:45, Lord Howe's half-hour DST, Troll's two hours, Santiago's midnight
gap, St John's old fall-back across midnight), at instants across 2000-2100, half of them
drawn within 30 hours of one of the zone's offset changes.
"""

from __future__ import annotations

import ast
import zoneinfo
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.nudging import local_time
from scheduler.nudging.local_time import (
    LocalTimeError,
    QuietHours,
    first_instant_at,
    in_quiet_hours,
    local_date,
    local_day_bounds,
    parse_quiet_hours,
    parse_time_zone,
    quiet_hours_end,
    quiet_period,
    zone_or_default,
)

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MICROSECOND = timedelta(microseconds=1)
HOUR = timedelta(hours=1)
Z = zoneinfo.ZoneInfo
BERLIN = Z("Europe/Berlin")
LORD_HOWE = Z("Australia/Lord_Howe")

ODD_ZONES = ("Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu", "Australia/Lord_Howe",
             "Europe/Berlin", "America/Santiago", "America/St_Johns", "Antarctica/Troll",
             "America/Havana", "Pacific/Apia", "Antarctica/Casey", "Pacific/Chatham")
REFUSED_NAMES = {"localtime", "posixrules", "Factory"}
PLACES = sorted(n for n in zoneinfo.available_timezones()
                if n not in REFUSED_NAMES and not n.startswith(("posix/", "right/")))
ZONE_NAMES = st.sampled_from(ODD_ZONES) | st.sampled_from(PLACES)
YEARS_2000_2100 = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 12, 31),
                               timezones=st.just(UTC))
WHOLE_MINUTES = st.builds(time, st.integers(0, 23), st.integers(0, 59))
# most transitions happen on the hour or the half hour, local or UTC
ROUND_TIMES = st.builds(time, st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def wall(instant: datetime, zone: tzinfo) -> datetime:
    """What the participant's clock reads at ``instant`` (naive)."""
    return instant.astimezone(zone).replace(tzinfo=None)


def offset(instant: datetime, zone: tzinfo) -> timedelta:
    value = instant.astimezone(zone).utcoffset()
    assert value is not None
    return value


def next_change(zone: tzinfo, after: datetime, within: timedelta = timedelta(days=400)) -> datetime | None:
    """The first instant after ``after`` at which the zone's UTC offset changes (to the
    second: the tz database's transitions are whole seconds), or None within ``within``."""
    step = timedelta(days=1)
    here, before = after, offset(after, zone)
    while here - after < within:
        there = here + step
        if offset(there, zone) != before:
            low, high = here, there
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) // 2
                if offset(middle, zone) == before:
                    low = middle
                else:
                    high = middle
            return high
        here = there
    return None


@st.composite
def situations(draw: st.DrawFn) -> tuple[tzinfo, datetime, list[time]]:
    """A zone, an instant in 2000-2100 (half the time within 30 h of an offset change of the
    zone), and the wall-clock times around that change (for quiet hours that end in it)."""
    zone = Z(draw(ZONE_NAMES))
    instant = draw(YEARS_2000_2100)
    near: list[time] = []
    if draw(st.booleans()):
        change = next_change(zone, instant)
        if change is not None:
            instant = change + draw(st.timedeltas(-30 * HOUR, 30 * HOUR))
            for moment in (change - MICROSECOND, change):
                reading = wall(moment, zone)
                near += [time(reading.hour, reading.minute),
                         time((reading + timedelta(minutes=1)).hour, (reading + timedelta(minutes=1)).minute)]
            near += [time(wall(change, zone).hour, 0), time((wall(change, zone) - timedelta(minutes=15)).hour, 30)]
    return zone, instant, near


@st.composite
def quiet_situations(draw: st.DrawFn) -> tuple[tzinfo, datetime, QuietHours]:
    zone, instant, near = draw(situations())
    times = (st.sampled_from(near) | ROUND_TIMES | WHOLE_MINUTES) if near else (ROUND_TIMES | WHOLE_MINUTES)
    start = draw(times)
    end = draw(times.filter(lambda t: t != start))
    return zone, instant, QuietHours(start, end)


def refused(parse: Callable[[Any], object], value: Any) -> LocalTimeError:
    with pytest.raises(LocalTimeError) as caught:
        parse(value)
    return caught.value


# -- LOCAL-1: the time zone ----------------------------------------------------------------------------


@pytest.mark.clause("LOCAL-1")
@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu",
                                  "Australia/Lord_Howe", "America/Argentina/Buenos_Aires", "America/Port-au-Prince",
                                  "Etc/GMT+5", "Etc/GMT-14", "Antarctica/Troll"])
def test_an_iana_name_is_a_time_zone_by_its_own_spelling(name: str) -> None:
    """LOCAL-1: a name of the tz database is accepted as it is spelt, and is that zone."""
    zone = parse_time_zone(name)
    assert zone.key == name
    assert zone is Z(name)


@pytest.mark.clause("LOCAL-1")
def test_every_place_of_the_installed_tz_database_is_accepted_and_nothing_that_is_not_a_place() -> None:
    """LOCAL-1: every name the tz database lists is accepted, save the files that are no
    place (the host's own zone, the POSIX default rules, the unconfigured placeholder)."""
    assert len(PLACES) > 400
    assert [n for n in PLACES if parse_time_zone(n).key != n] == []
    for name in sorted(REFUSED_NAMES & zoneinfo.available_timezones()):
        assert "not a place" in refused(parse_time_zone, name).errors[0]["message"]


@pytest.mark.clause("LOCAL-1")
@pytest.mark.parametrize("value", [
    None, 5, 1.5, True, ["Europe/Berlin"], {"name": "Europe/Berlin"},
    "", " ", " Europe/Berlin", "Europe/Berlin ", "Europe/Berlin\n", "Europe/Berlin\x00",
    "x" * 65, "Europe/" + "B" * 60,
    "Europe/Bérlin", "\uff25urope/Berlin", "Europe/Berlin\u200b",
    "Europe/../Europe/Berlin", "../../etc/passwd", "..", ".", "./UTC", "/etc/localtime", "/usr/share/zoneinfo/UTC",
    "Europe//Berlin", "Europe/Berlin/", "/Europe/Berlin", "Europe\\Berlin", "C:\\zoneinfo\\UTC",
    "europe/berlin", "EUROPE/BERLIN", "utc",
    "localtime", "posixrules", "Factory", "posix/Europe/Berlin", "right/UTC", "posix/UTC",
    "Mars/Olympus", "Europe", "America/Argentina", "zone.tab", "tzdata.zi", "leapseconds", "iso3166.tab",
    "+05:45", "UTC+2", "GMT+02:00", "CEST", "Z",
], ids=repr)
def test_anything_else_is_refused_with_a_message_naming_time_zone(value: Any) -> None:
    """LOCAL-1: not a string, empty, over-long, non-ASCII, a path, another spelling, a file
    that is no place, an unknown name or an offset: refused, the error naming ``time_zone``
    and saying what is expected; the value is quoted only when it passed the shape check."""
    error = refused(parse_time_zone, value)
    assert [e["field"] for e in error.errors] == ["time_zone"]
    message = error.errors[0]["message"]
    assert "IANA time zone name" in message
    assert str(error).startswith("time_zone: ")
    if isinstance(value, str) and (not value.isascii() or len(value) > 64 or "/" * 2 in value or "\\" in value):
        assert value not in message


@pytest.mark.clause("LOCAL-1")
def test_the_error_names_the_field_the_caller_gives_and_a_stored_name_reads_back_or_defaults_to_utc() -> None:
    """LOCAL-1: a caller parsing another field (a community's default) gets it named; a stored
    name reads back as its zone, none as UTC, an unknown one as the same refusal."""
    assert refused(lambda v: parse_time_zone(v, "default_time_zone"), "Mars/Olympus").errors[0]["field"] == \
        "default_time_zone"
    assert zone_or_default(None) is UTC
    assert zone_or_default("Asia/Kathmandu") is Z("Asia/Kathmandu")
    assert refused(zone_or_default, "Mars/Olympus").errors[0]["field"] == "time_zone"


# -- LOCAL-2: quiet hours ------------------------------------------------------------------------------


@pytest.mark.clause("LOCAL-2")
def test_quiet_hours_are_read_from_start_and_end_and_may_wrap_past_midnight() -> None:
    """LOCAL-2: ``{"start": "22:00", "end": "07:00"}`` wraps past midnight, ``00:00-23:59``
    does not, null is none; ``as_json`` writes what was read."""
    night = parse_quiet_hours({"start": "22:00", "end": "07:00"})
    assert night == QuietHours(time(22), time(7)) and night.wraps
    assert night.as_json() == {"start": "22:00", "end": "07:00"}
    day = parse_quiet_hours({"end": "23:59", "start": "00:00"})
    assert day == QuietHours(time(0), time(23, 59)) and not day.wraps
    assert parse_quiet_hours(None) is None
    assert night.covers_wall_time(time(23)) and night.covers_wall_time(time(6, 59))
    assert not night.covers_wall_time(time(7)) and not night.covers_wall_time(time(21, 59))


@pytest.mark.clause("LOCAL-2")
@pytest.mark.parametrize("given", ["24:00", "7:00", "07:0", "0700", "07:00:00", "07:60", "25:00", "-1:00", "07:00Z",
                                   "07:00+01:00", " 07:00", "07:00 ", "07h00", "07.00", "\u0660\u0667:\u0660\u0660",
                                   "\uff10\uff17:\uff10\uff10", "", 700,
                                   7.0, True, ["07:00"]], ids=repr)
def test_a_time_that_is_not_zero_padded_24_hour_hh_mm_is_refused_naming_its_field(given: Any) -> None:
    """LOCAL-2: each bound is ``HH:MM``, zero-padded, 00:00 to 23:59, ASCII digits; anything
    else is refused naming ``quiet_hours.start`` or ``quiet_hours.end``."""
    assert [e["field"] for e in refused(parse_quiet_hours, {"start": given, "end": "07:00"}).errors] == \
        ["quiet_hours.start"]
    assert [e["field"] for e in refused(parse_quiet_hours, {"start": "22:00", "end": given}).errors] == \
        ["quiet_hours.end"]


@pytest.mark.clause("LOCAL-2")
@pytest.mark.parametrize(("given", "fields"), [
    ({"start": "22:00", "end": "22:00"}, ["quiet_hours"]),
    ({"start": "22:00"}, ["quiet_hours.end"]),
    ({"end": "07:00"}, ["quiet_hours.start"]),
    ({}, ["quiet_hours.start", "quiet_hours.end"]),
    ({"start": None, "end": "07:00"}, ["quiet_hours.start"]),
    ({"start": "22:00", "end": "07:00", "zone": "UTC"}, ["quiet_hours"]),
    ({"start": "7:00", "end": "24:00", "days": [1]}, ["quiet_hours", "quiet_hours.start", "quiet_hours.end"]),
    ("22:00-07:00", ["quiet_hours"]),
    (["22:00", "07:00"], ["quiet_hours"]),
    (0, ["quiet_hours"]),
], ids=repr)
def test_quiet_hours_that_are_not_two_different_times_are_refused_with_every_problem_named(
        given: Any, fields: list[str]) -> None:
    """LOCAL-2: equal bounds, a missing bound, an unknown key or a value that is not an object
    are refused; every problem is reported at once, each naming its field."""
    assert [e["field"] for e in refused(parse_quiet_hours, given).errors] == fields


@pytest.mark.clause("LOCAL-2")
def test_quiet_hours_built_in_code_are_whole_local_minutes_with_different_ends() -> None:
    """LOCAL-2: the value itself refuses equal bounds, seconds and zoned times."""
    for start, end in [(time(7), time(7)), (time(7, 0, 30), time(8)), (time(7), time(8, tzinfo=UTC))]:
        with pytest.raises(ValueError):
            QuietHours(start, end)


# -- LOCAL-3: a local date and time as an instant ------------------------------------------------------


@pytest.mark.clause("LOCAL-3")
def test_berlin_0230_on_its_spring_forward_day_is_the_first_instant_after_the_gap() -> None:
    """LOCAL-3: 2027-03-28 02:30 does not exist in Europe/Berlin; it means 03:00 CEST, 01:00 UTC."""
    instant = first_instant_at(date(2027, 3, 28), time(2, 30), BERLIN)
    assert instant == utc(2027, 3, 28, 1, 0)
    assert instant.astimezone(BERLIN).isoformat() == "2027-03-28T03:00:00+02:00"
    assert wall(instant - MICROSECOND, BERLIN) < datetime(2027, 3, 28, 2, 30)


@pytest.mark.clause("LOCAL-3")
def test_a_time_a_fall_back_repeats_is_its_first_occurrence() -> None:
    """LOCAL-3: 2027-10-31 02:30 happens twice in Europe/Berlin; it means the first, 02:30
    CEST (00:30 UTC), not 02:30 CET (01:30 UTC). 01:30 on Lord Howe's fall-back day too."""
    assert first_instant_at(date(2027, 10, 31), time(2, 30), BERLIN) == utc(2027, 10, 31, 0, 30)
    assert first_instant_at(date(2027, 4, 4), time(1, 45), LORD_HOWE) == utc(2027, 4, 3, 14, 45)  # +11:00, not +10:30


@pytest.mark.clause("LOCAL-3")
def test_a_time_that_exists_once_is_that_instant_in_any_offset() -> None:
    """LOCAL-3: an ordinary local time is the instant with that reading: +14:00, -11:00, +05:45."""
    assert first_instant_at(date(2027, 1, 1), time(0), Z("Pacific/Kiritimati")) == utc(2026, 12, 31, 10)
    assert first_instant_at(date(2027, 1, 1), time(0), Z("Pacific/Pago_Pago")) == utc(2027, 1, 1, 11)
    assert first_instant_at(date(2027, 1, 1), time(7), Z("Asia/Kathmandu")) == utc(2027, 1, 1, 1, 15)
    assert first_instant_at(date(2027, 1, 1), time(7), UTC) == utc(2027, 1, 1, 7)
    assert first_instant_at(date(2027, 1, 1), time(7), timezone(timedelta(hours=-3))) == utc(2027, 1, 1, 10)


@pytest.mark.clause("LOCAL-3")
@SETTINGS
@given(situation=situations(), reading=WHOLE_MINUTES | ROUND_TIMES, days=st.integers(-1, 1))
@example(situation=(BERLIN, utc(2027, 3, 28, 1), []), reading=time(2, 30), days=0)
@example(situation=(BERLIN, utc(2027, 10, 31, 1), []), reading=time(2, 30), days=0)
def test_a_local_time_is_the_first_instant_the_clock_reads_it_or_later(
        situation: tuple[tzinfo, datetime, list[time]], reading: time, days: int) -> None:
    """LOCAL-3: the instant reads the local time or later and the microsecond before it reads
    earlier; when the time exists it reads exactly that, at its first occurrence."""
    zone, instant, near = situation
    day = wall(instant, zone).date() + timedelta(days=days)
    for chosen in [reading, *near]:
        target = datetime.combine(day, chosen)
        found = first_instant_at(day, chosen, zone)
        assert found.tzinfo is UTC
        assert wall(found, zone) >= target > wall(found - MICROSECOND, zone)
        occurrences = [c for c in (target.replace(tzinfo=zone, fold=f).astimezone(UTC) for f in (0, 1))
                       if wall(c, zone) == target]
        if occurrences:
            assert found == min(occurrences)


# -- LOCAL-4: quiet hours at an instant ----------------------------------------------------------------


NIGHT = QuietHours(time(22), time(7))


@pytest.mark.clause("LOCAL-4")
def test_quiet_hours_ending_in_berlins_spring_gap_end_at_the_first_instant_after_it() -> None:
    """LOCAL-4: quiet 22:00-02:30 on the night into 2027-03-28: 02:30 does not exist, so the
    quiet ends at 03:00 CEST, 01:00 UTC; a reminder due at 01:30 CET is held until then."""
    quiet = QuietHours(time(22), time(2, 30))
    due = utc(2027, 3, 28, 0, 30)  # 01:30 CET
    assert in_quiet_hours(due, BERLIN, quiet)
    assert quiet_hours_end(due, BERLIN, quiet) == utc(2027, 3, 28, 1, 0)
    assert quiet_period(due, BERLIN, quiet) == (utc(2027, 3, 27, 21), utc(2027, 3, 28, 1))
    assert not in_quiet_hours(utc(2027, 3, 28, 1, 0), BERLIN, quiet)
    assert in_quiet_hours(utc(2027, 3, 28, 1, 0) - MICROSECOND, BERLIN, quiet)


@pytest.mark.clause("LOCAL-4")
def test_quiet_hours_ending_in_berlins_repeated_hour_end_at_its_first_occurrence() -> None:
    """LOCAL-4: quiet 22:00-02:30 on the night into 2027-10-31 ends at the first 02:30
    (CEST, 00:30 UTC); when the clock reads 02:10 again (CET, 01:10 UTC) it is not quiet."""
    quiet = QuietHours(time(22), time(2, 30))
    assert quiet_hours_end(utc(2027, 10, 30, 23), BERLIN, quiet) == utc(2027, 10, 31, 0, 30)
    second_pass = utc(2027, 10, 31, 1, 10)
    assert wall(second_pass, BERLIN) == datetime(2027, 10, 31, 2, 10)
    assert not in_quiet_hours(second_pass, BERLIN, quiet)
    assert quiet_hours_end(second_pass, BERLIN, quiet) is None


@pytest.mark.clause("LOCAL-4")
def test_quiet_hours_starting_in_a_gap_begin_when_it_ends_and_starting_in_a_repeat_at_its_first_pass() -> None:
    """LOCAL-4: the start follows the same rule as the end: quiet 02:30-06:00 begins at 03:00
    CEST on 2027-03-28 (three hours, not three and a half), and at the first 02:30 on
    2027-10-31, so the whole repeated half hour after it is quiet (four and a half hours)."""
    quiet = QuietHours(time(2, 30), time(6))
    assert not in_quiet_hours(utc(2027, 3, 28, 1) - MICROSECOND, BERLIN, quiet)
    assert quiet_period(utc(2027, 3, 28, 1), BERLIN, quiet) == (utc(2027, 3, 28, 1), utc(2027, 3, 28, 4))
    assert quiet_period(utc(2027, 10, 31, 1, 10), BERLIN, quiet) == (utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 5))


@pytest.mark.clause("LOCAL-4")
def test_quiet_hours_inside_one_gap_do_not_happen_that_day() -> None:
    """LOCAL-4: quiet 02:10-02:40 falls wholly in Berlin's 2027-03-28 gap: no instant of that
    night is quiet, while the night before is quiet from 02:10 CET."""
    quiet = QuietHours(time(2, 10), time(2, 40))
    assert not any(in_quiet_hours(utc(2027, 3, 27, 22) + k * timedelta(minutes=5), BERLIN, quiet) for k in range(60))
    assert quiet_period(utc(2027, 3, 27, 1, 20), BERLIN, quiet) == (utc(2027, 3, 27, 1, 10), utc(2027, 3, 27, 1, 40))


@pytest.mark.clause("LOCAL-4")
def test_quiet_hours_on_lord_howe_move_by_its_half_hour() -> None:
    """LOCAL-4: Australia/Lord_Howe springs 02:00 to 02:30 on 2027-10-03: quiet 22:00-02:15
    ends at 02:30 (+11:00), 15:30 UTC; on an ordinary night it ends at 02:15 (+10:30), 15:45 UTC."""
    quiet = QuietHours(time(22), time(2, 15))
    assert quiet_hours_end(utc(2027, 10, 2, 14), LORD_HOWE, quiet) == utc(2027, 10, 2, 15, 30)
    assert quiet_hours_end(utc(2027, 9, 25, 14), LORD_HOWE, quiet) == utc(2027, 9, 25, 15, 45)


@pytest.mark.clause("LOCAL-4")
def test_quiet_hours_in_odd_offsets_end_at_their_local_time() -> None:
    """LOCAL-4: 22:00-07:00 ends at 07:00 local in +05:45, +14:00 and -11:00."""
    assert quiet_hours_end(utc(2027, 6, 1, 20), Z("Asia/Kathmandu"), NIGHT) == utc(2027, 6, 2, 1, 15)
    assert quiet_hours_end(utc(2026, 12, 31, 10), Z("Pacific/Kiritimati"), NIGHT) == utc(2026, 12, 31, 17)
    assert quiet_hours_end(utc(2027, 1, 1, 12), Z("Pacific/Pago_Pago"), NIGHT) == utc(2027, 1, 1, 18)
    assert quiet_hours_end(utc(2027, 1, 1, 12), Z("Pacific/Kiritimati"), NIGHT) == utc(2027, 1, 1, 17)  # 02:00, 2 Jan
    assert quiet_hours_end(utc(2027, 1, 1, 0), Z("Pacific/Kiritimati"), NIGHT) is None  # 14:00 on 1 January


@pytest.mark.clause("LOCAL-4")
def test_nights_that_touch_across_a_skipped_day_are_one_quiet_period() -> None:
    """LOCAL-4: Pacific/Apia skipped 2011-12-30 (23:59:59 on the 29th, then the 31st): the
    night of the 29th ends where the night of the 30th begins, and the quiet runs unbroken
    from 22:00 on the 29th to 07:00 on the 31st, nine hours."""
    apia = Z("Pacific/Apia")
    assert quiet_period(utc(2011, 12, 30, 9), apia, NIGHT) == (utc(2011, 12, 30, 8), utc(2011, 12, 30, 17))
    assert quiet_hours_end(utc(2011, 12, 30, 10), apia, NIGHT) == utc(2011, 12, 30, 17)
    # 02:00, 31st
    assert quiet_period(utc(2011, 12, 30, 12), apia, NIGHT) == (utc(2011, 12, 30, 8), utc(2011, 12, 30, 17))


@pytest.mark.clause("LOCAL-4")
@SETTINGS
@given(situation=quiet_situations(), fraction=st.floats(0, 1, exclude_max=True))
@example(situation=(BERLIN, utc(2027, 3, 28, 0, 30), QuietHours(time(22), time(2, 30))), fraction=0.5)
@example(situation=(BERLIN, utc(2027, 10, 31, 0, 20), QuietHours(time(22), time(2, 30))), fraction=0.5)
@example(situation=(LORD_HOWE, utc(2027, 10, 2, 15), QuietHours(time(22), time(2, 15))), fraction=0.5)
def test_the_end_of_quiet_hours_is_after_the_instant_and_every_instant_before_it_is_quiet(
        situation: tuple[tzinfo, datetime, QuietHours], fraction: float) -> None:
    """LOCAL-4: inside quiet hours the end is strictly later, not itself quiet, the instant
    just before it and any instant between are quiet, and the clock reads the end time there
    (or the end time fell in a gap and the end is the gap's end); the period's start is quiet
    and the instant before it is not. Outside quiet hours there is no end."""
    zone, instant, quiet = situation
    end = quiet_hours_end(instant, zone, quiet)
    assert (end is not None) == in_quiet_hours(instant, zone, quiet)
    if end is None:
        assert quiet_period(instant, zone, quiet) is None
        return
    period = quiet_period(instant, zone, quiet)
    assert period is not None
    start = period[0]
    assert end.tzinfo is UTC and start.tzinfo is UTC
    assert start <= instant < end <= start + timedelta(hours=48)
    assert not in_quiet_hours(end, zone, quiet)
    assert in_quiet_hours(end - MICROSECOND, zone, quiet)
    assert in_quiet_hours(min(instant + (end - instant) * fraction, end - MICROSECOND), zone, quiet)
    assert in_quiet_hours(start, zone, quiet)
    assert not in_quiet_hours(start - MICROSECOND, zone, quiet)
    reading = wall(end, zone)
    at_a_change = offset(end - MICROSECOND, zone) != offset(end, zone)
    assert (reading.hour, reading.minute) == (quiet.end.hour, quiet.end.minute) or at_a_change


@pytest.mark.clause("LOCAL-4")
@SETTINGS
@given(situation=quiet_situations())
def test_away_from_offset_changes_quiet_hours_are_the_wall_clock_hours(
        situation: tuple[tzinfo, datetime, QuietHours]) -> None:
    """LOCAL-4: when the zone's offset is the same for two days either side, an instant is
    quiet exactly when the participant's clock reads a time within ``[start, end)``."""
    zone, instant, quiet = situation
    if len({offset(instant + k * HOUR, zone) for k in range(-48, 49)}) == 1:
        assert in_quiet_hours(instant, zone, quiet) == quiet.covers_wall_time(wall(instant, zone).time())


@pytest.mark.clause("LOCAL-4")
@SETTINGS
@given(situation=situations())
def test_without_quiet_hours_no_instant_is_quiet(situation: tuple[tzinfo, datetime, list[time]]) -> None:
    """LOCAL-4: ``None`` quiet hours: never quiet, no end, no period."""
    zone, instant, _ = situation
    assert not in_quiet_hours(instant, zone, None)
    assert quiet_hours_end(instant, zone, None) is None
    assert quiet_period(instant, zone, None) is None


# -- LOCAL-5: the participant's day --------------------------------------------------------------------


@pytest.mark.clause("LOCAL-5")
@pytest.mark.parametrize(("zone", "day", "start", "hours"), [
    ("Europe/Berlin", date(2027, 3, 28), utc(2027, 3, 27, 23), 23),
    ("Europe/Berlin", date(2027, 10, 31), utc(2027, 10, 30, 22), 25),
    ("Europe/Berlin", date(2027, 6, 1), utc(2027, 5, 31, 22), 24),
    ("Australia/Lord_Howe", date(2027, 10, 3), utc(2027, 10, 2, 13, 30), 23.5),
    ("Australia/Lord_Howe", date(2027, 4, 4), utc(2027, 4, 3, 13), 24.5),
    ("Antarctica/Troll", date(2027, 3, 28), utc(2027, 3, 28), 22),
    ("Antarctica/Troll", date(2027, 10, 31), utc(2027, 10, 30, 22), 26),
    ("Pacific/Kiritimati", date(2027, 1, 1), utc(2026, 12, 31, 10), 24),
    ("Pacific/Pago_Pago", date(2027, 1, 1), utc(2027, 1, 1, 11), 24),
    ("Asia/Kathmandu", date(2027, 1, 1), utc(2026, 12, 31, 18, 15), 24),
    # midnight in the gap (Saturday 24:00 -> Sunday 01:00): the day starts at 01:00 -03:00
    ("America/Santiago", date(2027, 9, 5), utc(2027, 9, 5, 4), 23),
    ("America/Santiago", date(2027, 4, 3), utc(2027, 4, 3, 3), 25),
    # midnight repeated (01:00 CDT -> 00:00 CST): the day starts at the first, 00:00 -04:00
    ("America/Havana", date(2027, 11, 7), utc(2027, 11, 7, 4), 25),
    ("America/Havana", date(2027, 3, 14), utc(2027, 3, 14, 5), 23),
], ids=lambda v: str(v))
def test_a_participants_day_runs_from_their_midnight_to_the_next_and_has_the_hours_of_its_changes(
        zone: str, day: date, start: datetime, hours: float) -> None:
    """LOCAL-5: the day's bounds in UTC, 24 h minus the day's change: 23/25 h in Berlin,
    23.5/24.5 h on Lord Howe, 22/26 h at Troll; a midnight in a gap starts the day when the
    gap ends (Santiago), a repeated midnight at its first occurrence (Havana)."""
    tz = Z(zone)
    for probe in (start, start + timedelta(hours=hours) - MICROSECOND, start + timedelta(hours=hours / 2)):
        assert local_day_bounds(probe, tz) == (start, start + timedelta(hours=hours))
        assert local_date(probe, tz) == day
    assert local_day_bounds(start - MICROSECOND, tz)[1] == start


@pytest.mark.clause("LOCAL-5")
def test_the_minutes_a_fall_back_repeats_across_midnight_belong_to_the_new_day() -> None:
    """LOCAL-5: America/St_Johns fell back at 00:01 NDT to 23:01 NST until 2011: on
    2006-10-29 the clock read 23:01 to 23:59 of the 28th a second time. The 29th had begun
    at its first midnight, so those minutes are the 29th's (days never overlap): the 28th is
    24 h and the 29th 25 h."""
    st_johns = Z("America/St_Johns")
    second_pass = utc(2006, 10, 29, 2, 31)
    assert wall(second_pass, st_johns) == datetime(2006, 10, 28, 23, 1)
    assert local_date(second_pass, st_johns) == date(2006, 10, 29)
    assert local_day_bounds(second_pass, st_johns) == (utc(2006, 10, 29, 2, 30), utc(2006, 10, 30, 3, 30))
    assert local_day_bounds(utc(2006, 10, 29, 2, 30) - MICROSECOND, st_johns) == \
        (utc(2006, 10, 28, 2, 30), utc(2006, 10, 29, 2, 30))


@pytest.mark.clause("LOCAL-5")
def test_a_skipped_date_has_no_day_and_its_neighbours_touch() -> None:
    """LOCAL-5: Pacific/Apia's 2011-12-30 never happened: the 29th ends where the 31st begins."""
    apia = Z("Pacific/Apia")
    the_29th = local_day_bounds(utc(2011, 12, 30, 9), apia)
    assert the_29th == (utc(2011, 12, 29, 10), utc(2011, 12, 30, 10))
    assert local_date(the_29th[1], apia) == date(2011, 12, 31)
    assert local_day_bounds(the_29th[1], apia) == (utc(2011, 12, 30, 10), utc(2011, 12, 31, 10))


@pytest.mark.clause("LOCAL-5")
@SETTINGS
@given(situation=situations())
@example(situation=(BERLIN, utc(2027, 3, 28, 12), []))
@example(situation=(Z("America/Santiago"), utc(2027, 9, 5, 4), []))
@example(situation=(Z("America/St_Johns"), utc(2006, 10, 29, 2, 31), []))
def test_days_hold_their_instant_tile_time_and_last_24_hours_less_their_offset_change(
        situation: tuple[tzinfo, datetime, list[time]]) -> None:
    """LOCAL-5: the day holds the instant and lies within 48 h of it; the day before ends
    where it starts and the day after starts where it ends; it starts when the clock first
    reads its date at 00:00 or later; when both its ends read midnight it lasts 24 h minus
    the change of the zone's offset across it (when they do not, a gap swallowed a midnight)."""
    zone, instant, _ = situation
    start, end = local_day_bounds(instant, zone)
    assert start.tzinfo is UTC and end.tzinfo is UTC
    assert instant - timedelta(hours=48) <= start <= instant < end <= instant + timedelta(hours=48)
    assert local_day_bounds(end, zone)[0] == end
    assert local_day_bounds(start - MICROSECOND, zone)[1] == start
    midnight = datetime.combine(local_date(instant, zone), time(0))
    assert wall(start, zone) >= midnight > wall(start - MICROSECOND, zone)
    if wall(start, zone).time() == time(0) and wall(end, zone).time() == time(0):
        assert end - start == timedelta(hours=24) - (offset(end, zone) - offset(start, zone))
    else:
        assert offset(start - MICROSECOND, zone) != offset(start, zone) or \
            offset(end - MICROSECOND, zone) != offset(end, zone)


# -- LOCAL-6: the default changes nothing --------------------------------------------------------------


@pytest.mark.clause("LOCAL-6")
@pytest.mark.clause("DEC-LOCAL-TIME")
@SETTINGS
@given(instant=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(9998, 12, 31),
                            timezones=st.sampled_from([UTC, Z("Europe/Berlin"), Z("Pacific/Kiritimati"),
                                                       timezone(timedelta(hours=-11))])))
@example(instant=datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC))
def test_with_the_default_zone_and_no_quiet_hours_the_day_is_the_utc_day_and_nothing_is_held(
        instant: datetime) -> None:
    """LOCAL-6, DEC-LOCAL-TIME: a participant without a zone has the default, UTC, whose day
    is the UTC calendar day the cap counts today (DEC-4), however the instant is given; and
    without quiet hours nothing is held."""
    utc_midnight = datetime.combine(instant.astimezone(UTC).date(), time(0), tzinfo=UTC)
    for default in (zone_or_default(None), parse_time_zone(local_time.DEFAULT_TIME_ZONE_NAME)):
        assert local_day_bounds(instant, default) == (utc_midnight, utc_midnight + timedelta(days=1))
        assert local_date(instant, default) == utc_midnight.date()
        assert quiet_hours_end(instant, default, None) is None


@pytest.mark.clause("DEC-LOCAL-TIME")
def test_a_held_reminders_not_before_is_when_the_quiet_ends_and_its_cap_day_is_the_day_it_is_sent() -> None:
    """DEC-LOCAL-TIME: a Berlin participant's reminder due at 23:30 CET on 2027-03-27 under
    quiet hours 22:00-07:00 is held until 07:00 CEST on the 28th (05:00 UTC); when it is sent
    then, it counts against the 28th, a 23-hour day, not the UTC day it fell due in."""
    due = utc(2027, 3, 27, 22, 30)
    not_before = quiet_hours_end(due, BERLIN, NIGHT)
    assert not_before == utc(2027, 3, 28, 5)
    assert local_day_bounds(not_before, BERLIN) == (utc(2027, 3, 27, 23), utc(2027, 3, 28, 22))
    assert local_day_bounds(due, BERLIN) == (utc(2027, 3, 26, 23), utc(2027, 3, 27, 23))


# -- LOCAL-7: pure -------------------------------------------------------------------------------------


PURE_IMPORTS = {"__future__", "functools", "re", "zoneinfo", "collections.abc", "dataclasses", "datetime", "typing"}


@pytest.mark.clause("LOCAL-7")
def test_the_module_imports_only_the_standard_librarys_time_and_text_modules_and_reads_no_clock() -> None:
    """LOCAL-7: no database, no clock: the module imports only these standard modules and
    never calls ``now``, ``today``, ``utcnow``, ``monotonic`` or the like."""
    source = Path(local_time.__file__).read_text()
    tree = ast.parse(source)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= PURE_IMPORTS, imported - PURE_IMPORTS
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert called.isdisjoint({"now", "today", "utcnow", "time_ns", "monotonic", "perf_counter", "execute"})


@pytest.mark.clause("LOCAL-7")
@pytest.mark.parametrize("instant", [datetime(2027, 3, 28, 1), datetime(1, 1, 2, tzinfo=UTC),
                                     datetime(9999, 12, 20, tzinfo=UTC)], ids=["naive", "year-1", "year-9999"])
def test_an_instant_must_be_aware_and_inside_the_range_every_storable_instant_is_in(instant: datetime) -> None:
    """LOCAL-7: a naive instant, or one too near datetime's ends to form its neighbouring local
    days, is a ValueError, never a wrong answer; the storable range (DEC-TRIGGER) is inside."""
    for call in (lambda: local_day_bounds(instant, BERLIN), lambda: in_quiet_hours(instant, BERLIN, NIGHT),
                 lambda: quiet_hours_end(instant, BERLIN, None)):
        with pytest.raises(ValueError):
            call()
    for edge in (utc(2000, 1, 1), utc(9999, 1, 1) - MICROSECOND):
        for zone in (Z("Etc/GMT-14"), Z("Etc/GMT+12"), Z("Pacific/Kiritimati"), Z("Pacific/Pago_Pago")):
            start, end = local_day_bounds(edge, zone)
            assert start <= edge < end
            in_quiet_hours(edge, zone, QuietHours(time(23, 59), time(0, 1)))
