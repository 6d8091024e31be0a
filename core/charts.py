"""Charts drawn on the server as SVG markup: the pieces, and the few kinds of chart the admin uses.

The admin's pages run no script (the CSP allows none inline, and a chart needs none), so a chart
is a string the template puts in the page. Colours and strokes are presentation attributes, not
`style=` (which the CSP refuses); axes and text draw in `currentColor`, so they follow the admin's
light and dark themes. The size comes from the viewBox: the page's CSS sets the width, so a chart
shrinks to a phone's width with its text. Every text is escaped. A mark carries a `<title>`: the
browser shows it on hover or long press, and a screen reader reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

FONT = 14
WIDTH = 480
GRID_OPACITY = 0.15
# What a character of the sans-serif font takes, roughly, for laying out legends and labels.
CHAR_WIDTH = FONT * 0.58


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    values: Sequence[float | None]  # one per x label; None: nothing to draw there


def svg_open(width: float, height: float, *, label: str, css: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:g}" '
        f'class="{escape(css)}" role="img" font-size="{FONT}" font-family="sans-serif">',
        f"<title>{escape(label)}</title>",
    ]


def line(x1, y1, x2, y2, *, stroke, width=1, dash="", opacity=None, css=""):
    extra = (f' stroke-dasharray="{dash}"' if dash else "") + (
        f' stroke-opacity="{opacity}"' if opacity else ""
    )
    extra += f' class="{css}"' if css else ""
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
        f'stroke-width="{width}"{extra}/>'
    )


def text(x, y, value, *, anchor="start", css=""):
    extra = f' class="{css}"' if css else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="currentColor"{extra}>'
        f"{escape(value)}</text>"
    )


def rect(x, y, width, height, *, fill, title="", css="", opacity=None):
    extra = (f' class="{css}"' if css else "") + (f' fill-opacity="{opacity}"' if opacity else "")
    body = f"<title>{escape(title)}</title>" if title else ""
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(width, 0):.1f}" height="{max(height, 0):.1f}" '
        f'fill="{fill}"{extra}>{body}</rect>'
    )


def circle(x, y, *, fill, r=3.5, title="", stroke="", css=""):
    extra = (f' stroke="{stroke}" stroke-width="2"' if stroke else "") + (
        f' class="{css}"' if css else ""
    )
    body = f"<title>{escape(title)}</title>" if title else ""
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}"{extra}>{body}</circle>'


def legend_row(
    entries: Sequence[tuple[str, str, str]], *, x: float, y: float, swatch: str = "line"
) -> list[str]:
    """One row of (text, colour, dash) keys from (x, y): a short line (or a square) then the
    text."""
    out = []
    for label, colour, dash in entries:
        if swatch == "line":
            out.append(
                line(x, y - FONT / 3, x + 18, y - FONT / 3, stroke=colour, dash=dash, width=2)
            )
        else:
            out.append(rect(x + 4, y - FONT * 0.75, 10, 10, fill=colour))
        out.append(text(x + 22, y, label))
        x += 22 + len(label) * CHAR_WIDTH + 14
    return out


def legend(
    entries: Sequence[tuple[str, str]],
    *,
    y: float = 18,
    swatch: str = "square",
    width: float = WIDTH,
) -> tuple[list[str], float]:
    """(text, colour) keys from the top left, wrapped onto as many rows as they need; the marks
    and the y below the last row."""
    rows: list[list[tuple[str, str, str]]] = [[]]
    x = 4.0
    for label, colour in entries:
        room = 22 + len(label) * CHAR_WIDTH + 14
        if rows[-1] and x + room - 14 > width:
            rows.append([])
            x = 4.0
        rows[-1].append((label, colour, ""))
        x += room
    out = []
    for index, row in enumerate(rows):
        out += legend_row(row, x=4, y=y + index * (FONT + 6), swatch=swatch)
    return out, y + (len(rows) - 1) * (FONT + 6) + 8


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values spanning [lo, hi], about `count` of them, a step of 1, 2 or 5 × 10ⁿ apart."""
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(first, last + 1)]


def number(value: float) -> str:
    """A figure as a label: whole numbers bare, others to the precision they need (money spent
    in a few minutes is a fraction of a cent: two significant digits below 0.1)."""
    if value and abs(value) < 0.1:
        return f"{value:.2g}" if abs(value) >= 1e-4 else f"{value:.1e}"
    small = abs(value) < 10
    rounded = round(value, 2 if small else 1)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.2f}".rstrip("0") if small else f"{rounded:.1f}"


# --- charts over time ---------------------------------------------------------------------------

# The plot inside a chart over time: room on the left for the y labels, below for the x labels;
# the legend above sets the top.
_LEFT, _RIGHT, _BOTTOM, _PLOT_HEIGHT = 52, 12, 28, 180


class _TimePlot:
    """The frame shared by the charts over time: y grid and labels, x labels under their slots."""

    def __init__(
        self,
        labels: Sequence[str],
        top_value: float,
        *,
        top: float,
        fmt: Callable[[float], str],
        fixed_top: bool = False,
    ):
        self.labels = list(labels)
        self.top, self.right = top, WIDTH - _RIGHT
        self.bottom = top + _PLOT_HEIGHT
        self.height = self.bottom + _BOTTOM
        self.slot = (self.right - _LEFT) / max(len(self.labels), 1)
        if fixed_top:
            self.ticks = [top_value * i / 4 for i in range(5)]
        else:
            self.ticks = nice_ticks(0.0, max(top_value, 1.0), 4)
        self.hi = self.ticks[-1] or 1.0
        self.fmt = fmt

    def x_of(self, index: int) -> float:
        return _LEFT + (index + 0.5) * self.slot

    def y_of(self, value: float) -> float:
        return self.bottom - min(max(value, 0.0), self.hi) / self.hi * (self.bottom - self.top)

    def frame(self) -> list[str]:
        out = []
        for tick in self.ticks:
            y = self.y_of(tick)
            out.append(line(_LEFT, y, self.right, y, stroke="currentColor", opacity=GRID_OPACITY))
            out.append(text(_LEFT - 6, y + FONT / 3, self.fmt(tick), anchor="end"))
        out.append(line(_LEFT, self.top, _LEFT, self.bottom, stroke="currentColor"))
        out.append(line(_LEFT, self.bottom, self.right, self.bottom, stroke="currentColor"))
        # As many labels as fit side by side, evenly spread, the last slot always named.
        widest = max((len(label) for label in self.labels), default=1) * CHAR_WIDTH + 12
        every = max(1, math.ceil(widest / self.slot))
        for index in range(len(self.labels) - 1, -1, -every):
            out.append(
                text(self.x_of(index), self.bottom + FONT + 4, self.labels[index], anchor="middle")
            )
        return out

    def empty(self, message: str) -> str:
        return text(
            (_LEFT + self.right) / 2, (self.top + self.bottom) / 2, message, anchor="middle"
        )


def bars_over_time(
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    label: str,
    css: str = "bars",
    unit: str = "",
) -> str:
    """Stacked bars, one per label (a time slot), one colour per series, with a legend above."""
    keys, top = legend([(s.name, s.colour) for s in series])
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(labels))]
    plot = _TimePlot(labels, max(totals, default=0), top=top, fmt=number)
    out = svg_open(WIDTH, plot.height, label=label, css=css) + keys + plot.frame()
    width = plot.slot * 0.78
    for index, slot_label in enumerate(labels):
        base = 0.0
        for s in series:
            value = s.values[index] or 0
            if value <= 0:
                continue
            y = plot.y_of(base + value)
            out.append(
                rect(
                    plot.x_of(index) - width / 2,
                    y,
                    width,
                    plot.y_of(base) - y,
                    fill=s.colour,
                    css=f"bar {slug(s.name)}",
                    title=f"{slot_label} · {s.name}: {number(value)}{(' ' + unit) if unit else ''}",
                )
            )
            base += value
    if not any(totals):
        out.append(plot.empty("Nothing in this period"))
    out.append("</svg>")
    return "\n".join(out)


def lines_over_time(
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    label: str,
    css: str = "lines",
    percent: bool = False,
    unit: str = "",
) -> str:
    """One line per series across the time slots, broken where a value is None; a dot on each value.
    `percent`: the values are ratios (0 to 1), drawn on a fixed 0–100 % scale."""
    keys, top = legend([(s.name, s.colour) for s in series], swatch="line")
    values = [v for s in series for v in s.values if v is not None]
    if percent:
        plot = _TimePlot(labels, 1.0, top=top, fmt=lambda v: f"{v * 100:.0f}%", fixed_top=True)
    else:
        plot = _TimePlot(labels, max(values, default=0), top=top, fmt=number)
    shown = (
        (lambda v: f"{v * 100:.1f}%")
        if percent
        else (lambda v: f"{number(v)}{(' ' + unit) if unit else ''}")
    )
    out = svg_open(WIDTH, plot.height, label=label, css=css) + keys + plot.frame()
    for s in series:
        runs: list[list[str]] = [[]]
        for index, value in enumerate(s.values):
            if value is None:
                runs.append([])
            else:
                runs[-1].append(f"{plot.x_of(index):.1f},{plot.y_of(value):.1f}")
        for run in runs:
            if len(run) > 1:
                out.append(
                    f'<polyline class="{slug(s.name)}" points="{" ".join(run)}" fill="none" '
                    f'stroke="{s.colour}" stroke-width="2" stroke-linejoin="round"/>'
                )
        for index, value in enumerate(s.values):
            if value is not None:
                out.append(
                    circle(
                        plot.x_of(index),
                        plot.y_of(value),
                        fill=s.colour,
                        css=f"point {slug(s.name)}",
                        title=f"{labels[index]} · {s.name}: {shown(value)}",
                    )
                )
    if not values:
        out.append(plot.empty("Nothing in this period"))
    out.append("</svg>")
    return "\n".join(out)


# --- percentiles by name ------------------------------------------------------------------------


def percentile_bars(
    groups: Sequence[tuple[str, Sequence[tuple[str, float | None, float | None]]]],
    *,
    measures: Sequence[tuple[str, str]],
    label: str,
    css: str = "percentiles",
    unit: str = "ms",
) -> str:
    """Horizontal bars: for each group (a target), one bar per measure (TTFT, latency) reaching its
    p95, light, with its p50 dark over it. A group is (name, [(measure, p50, p95), …]);
    `measures` the legend's (measure, colour), in the groups' order."""
    keys, top = legend([*measures, ("dark: p50, light: p95", "none")])
    name_width = _name_width(name for name, _ in groups)
    left, right = name_width + 8, WIDTH - 16
    bar, gap = 12, 10
    per_group = max((len(rows) for _, rows in groups), default=1) * (bar + 2) + gap
    bottom = top + max(len(groups), 1) * per_group
    height = bottom + FONT + 16
    highest = max(
        (v for _, rows in groups for _, p50, p95 in rows for v in (p50, p95) if v is not None),
        default=0,
    )
    ticks = nice_ticks(0.0, max(highest, 1.0), 4)
    hi = ticks[-1]
    colours = dict(measures)

    def x_of(value: float) -> float:
        return left + min(max(value, 0.0), hi) / hi * (right - left)

    out = svg_open(WIDTH, height, label=label, css=css) + keys
    for tick in ticks:
        x = x_of(tick)
        out.append(line(x, top - 4, x, bottom, stroke="currentColor", opacity=GRID_OPACITY))
        out.append(
            text(
                x,
                bottom + FONT + 4,
                number(tick) + (f" {unit}" if tick == ticks[-1] else ""),
                anchor="end" if tick == ticks[-1] else "middle",
            )
        )
    y = top
    for name, rows in groups:
        out.append(
            text(
                name_width,
                y + len(rows) * (bar + 2) / 2 + FONT / 3,
                _fit(name, name_width),
                anchor="end",
            )
        )
        for measure, p50, p95 in rows:
            colour = colours.get(measure, "currentColor")
            if p95 is not None:
                out.append(
                    rect(
                        left,
                        y,
                        x_of(p95) - left,
                        bar,
                        fill=colour,
                        opacity=0.35,
                        css=f"p95 {slug(measure)}",
                        title=f"{name} · {measure} p95: {number(p95)} {unit}",
                    )
                )
            if p50 is not None:
                out.append(
                    rect(
                        left,
                        y,
                        x_of(p50) - left,
                        bar,
                        fill=colour,
                        css=f"p50 {slug(measure)}",
                        title=f"{name} · {measure} p50: {number(p50)} {unit}",
                    )
                )
            y += bar + 2
        y += gap
    out.append(line(left, top - 4, left, bottom, stroke="currentColor"))
    if not groups:
        out.append(
            text((left + right) / 2, (top + bottom) / 2, "Nothing in this period", anchor="middle")
        )
    out.append("</svg>")
    return "\n".join(out)


# --- states over time ---------------------------------------------------------------------------


def timeline(
    rows: Sequence[tuple[str, Sequence[tuple[float, float, str, str]]]],
    *,
    ticks: Sequence[tuple[float, str]],
    keys: Sequence[tuple[str, str]],
    label: str,
    css: str = "timeline",
) -> str:
    """One band per row (an engine) coloured by its state over time. A row is (name, segments),
    each segment (start, end, colour, title) with start and end as fractions of the period;
    `ticks` are (fraction, text) under the bands, `keys` the legend's (text, colour)."""
    marks, top = legend(keys)
    name_width = _name_width(name for name, _ in rows)
    left, right, band = name_width + 8, WIDTH - 12, 18
    bottom = top + max(len(rows), 1) * (band + 8)
    height = bottom + FONT + 12

    def x_of(fraction: float) -> float:
        return left + min(max(fraction, 0.0), 1.0) * (right - left)

    out = svg_open(WIDTH, height, label=label, css=css) + marks
    for fraction, tick_label in ticks:
        x = x_of(fraction)
        out.append(line(x, top - 4, x, bottom, stroke="currentColor", opacity=GRID_OPACITY))
        out.append(text(x, bottom + FONT + 4, tick_label, anchor="middle"))
    y = top
    for name, segments in rows:
        out.append(text(name_width, y + band / 2 + FONT / 3, _fit(name, name_width), anchor="end"))
        for start, end, colour, title in segments:
            out.append(
                rect(
                    x_of(start),
                    y,
                    x_of(end) - x_of(start),
                    band,
                    fill=colour,
                    title=title,
                    css="segment",
                )
            )
        y += band + 8
    if not rows:
        out.append(text((left + right) / 2, (top + bottom) / 2, "No engines", anchor="middle"))
    out.append("</svg>")
    return "\n".join(out)


def slug(name: str) -> str:
    """A name as a class in the markup (tests and stylesheets find marks by it)."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "series"


def _name_width(names) -> float:
    # Names on the left take what the longest needs, up to a third of the width.
    return min(WIDTH / 3, max((len(name) for name in names), default=4) * CHAR_WIDTH + 8)


def _fit(name: str, width: float) -> str:
    room = int(width / CHAR_WIDTH)
    return name if len(name) <= room else name[: max(room - 1, 1)] + "…"
