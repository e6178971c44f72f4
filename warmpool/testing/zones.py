"""A time zone in which it is about noon now: for schedules a test or benchmark writes in
local time, so that a window of a few minutes never spans midnight, whenever it runs."""

from __future__ import annotations

from datetime import datetime, timedelta


def noon_zone(now: datetime) -> tuple[str, timedelta]:
    """An `Etc/GMT±N` zone where it is between 11:00 and 13:00 at `now` (UTC), and its UTC
    offset. POSIX-style names: Etc/GMT-3 is three hours *ahead* of UTC."""
    offset = max(-12, min(14, 12 - now.hour))
    name = "Etc/UTC" if offset == 0 else f"Etc/GMT{'-' if offset > 0 else '+'}{abs(offset)}"
    return name, timedelta(hours=offset)
