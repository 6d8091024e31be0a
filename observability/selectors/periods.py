"""The periods the dashboard shows (the last hour, day or week) and their slots."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# name: (span, slot). Slots start on whole multiples of their length since the epoch (UTC), so a
# page reloaded within a slot shows the same slots.
PERIODS: dict[str, tuple[timedelta, timedelta]] = {
    "hour": (timedelta(hours=1), timedelta(minutes=5)),
    "day": (timedelta(days=1), timedelta(hours=1)),
    "week": (timedelta(days=7), timedelta(hours=6)),
}


@dataclass(frozen=True)
class Period:
    name: str
    start: datetime
    end: datetime  # exclusive; the slot now in progress is the last one
    slot: timedelta

    @property
    def slots(self) -> list[datetime]:
        count = round((self.end - self.start) / self.slot)
        return [self.start + i * self.slot for i in range(count)]


def period_at(name: str, *, now: datetime) -> Period:
    """The period `name` (a key of PERIODS) that ends with the slot holding `now`."""
    span, slot = PERIODS[name]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    end = epoch + ((now - epoch) // slot + 1) * slot
    return Period(name=name, start=end - span, end=end, slot=slot)
