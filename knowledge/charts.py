"""The calibration curve, drawn on the server as SVG markup (the pieces: core.charts)."""

from __future__ import annotations

import math

from core.charts import FONT, legend_row, line, nice_ticks, svg_open, text

WIDTH, HEIGHT = 480, 320
# The plot area inside the viewBox: room on the left for the y labels, above for the legend,
# below for the x labels and the axis title.
LEFT, RIGHT, TOP, BOTTOM = 40, 20, 56, 40
PRECISION, RECALL = "#2f6db5", "#d9730d"
RECOMMENDED, CURRENT, TARGET = "#2a9d4b", "#8a5cd1", "#888888"


def calibration_chart(
    curve: list,
    *,
    recommended: tuple[float, float, float, float] | None = None,
    current: tuple[float, float] | None = None,
    target: float | None = None,
    label: str = "",
) -> str:
    """Precision and recall against threshold, as an `<svg>` element.

    `curve` is `Calibration.curve`: [[threshold, margin, precision, recall], …]. `recommended`
    (threshold, margin, precision, recall) is drawn as a line across the plot with a dot on each
    curve, `current` (threshold, margin) as a dashed line, `target` as a dashed level of precision.
    `label` names the chart for screen readers. Every text is escaped."""
    rows = sorted(
        (float(row[0]), float(row[2]), float(row[3]))
        for row in curve
        if isinstance(row, (list, tuple)) and len(row) >= 4
    )
    xs = [t for t, _, _ in rows] + [p[0] for p in (recommended, current) if p is not None]
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    ticks = nice_ticks(lo, hi)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM

    def x_at(value: float) -> float:
        return LEFT + (value - lo) / (hi - lo) * (right - LEFT)

    def y_at(value: float) -> float:
        return bottom - min(max(value, 0.0), 1.0) * (bottom - TOP)

    out = svg_open(
        WIDTH,
        HEIGHT,
        label=label or "Precision and recall against threshold",
        css="calibration-chart",
    )
    # Grid and axes.
    for level in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        y = y_at(level)
        out.append(line(LEFT, y, right, y, stroke="currentColor", opacity=0.15))
        out.append(text(LEFT - 6, y + FONT / 3, f"{level:.1f}", anchor="end"))
    decimals = max(0, -math.floor(math.log10(ticks[1] - ticks[0]))) if len(ticks) > 1 else 2
    for tick in ticks:
        x = x_at(tick)
        out.append(line(x, bottom, x, bottom + 4, stroke="currentColor"))
        out.append(text(x, bottom + 4 + FONT, f"{tick:.{decimals}f}", anchor="middle"))
    out.append(line(LEFT, TOP, LEFT, bottom, stroke="currentColor"))
    out.append(line(LEFT, bottom, right, bottom, stroke="currentColor"))
    out.append(text((LEFT + right) / 2, HEIGHT - 4, "threshold", anchor="middle"))

    if target is not None:
        y = y_at(target)
        out.append(line(LEFT, y, right, y, stroke=TARGET, dash="2 3"))
    if current is not None:
        x = x_at(current[0])
        out.append(line(x, TOP, x, bottom, stroke=CURRENT, dash="6 4", width=2, css="current"))
    if recommended is not None:
        x = x_at(recommended[0])
        out.append(line(x, TOP, x, bottom, stroke=RECOMMENDED, width=2, css="recommended"))

    if rows:
        for index, colour in ((1, PRECISION), (2, RECALL)):
            points = " ".join(f"{x_at(row[0]):.1f},{y_at(row[index]):.1f}" for row in rows)
            name = "precision" if index == 1 else "recall"
            out.append(
                f'<polyline class="{name}" points="{points}" fill="none" stroke="{colour}" '
                f'stroke-width="2" stroke-linejoin="round"/>'
            )
    else:
        out.append(
            text((LEFT + right) / 2, (TOP + bottom) / 2, "No points to draw", anchor="middle")
        )
    if recommended is not None:
        x = x_at(recommended[0])
        for value, colour in ((recommended[2], PRECISION), (recommended[3], RECALL)):
            if value is not None:
                out.append(
                    f'<circle cx="{x:.1f}" cy="{y_at(value):.1f}" r="4.5" fill="{colour}" '
                    f'stroke="{RECOMMENDED}" stroke-width="2"/>'
                )

    # The legend, two rows above the plot: the curves, then the marked points with their values.
    legend = [[("precision", PRECISION, ""), ("recall", RECALL, "")], []]
    if target is not None:
        legend[0].append((f"target {target:.2f}", TARGET, "2 3"))
    if recommended is not None:
        legend[1].append(
            (f"recommended {recommended[0]:.3f} / {recommended[1]:.3f}", RECOMMENDED, "")
        )
    if current is not None:
        legend[1].append((f"current {current[0]:.3f} / {current[1]:.3f}", CURRENT, "6 4"))
    for row_index, entries in enumerate(legend):
        out += legend_row(entries, x=8, y=16 + row_index * (FONT + 8))
    out.append("</svg>")
    return "\n".join(out)
