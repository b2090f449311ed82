"""The cost page's charts, drawn on the server as SVG: no script, no library from a CDN.

`spend_chart` draws spend per day as stacked columns over the page's full width (the
SVG scales to its container through its viewBox; at 1,400 px it is drawn about 1:1):
amounts on the left axis, dates below, a legend with each series' total, the
period's total in the heading, and the day budget as a dashed line.
"""

import math
from datetime import date
from decimal import Decimal

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .series import SpendSeries

WIDTH, PLOT_HEIGHT = 1300, 280
LEFT, RIGHT, BOTTOM = 80, 20, 44
LEGEND_ROW = 22
# Distinguishable colours, in the legend's order ("other" is grey).
PALETTE = (
    "#417690",
    "#e07b39",
    "#4e9a06",
    "#b8336a",
    "#7a5cc4",
    "#c4a000",
    "#2aa198",
    "#8f5902",
)
OTHER_COLOUR = "#9a9a9a"
MAX_DATE_LABELS = 15


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Axis values from 0 to at least `top` in round steps (1, 2, 2.5 or 5 times 10^n)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def amount(value: float | Decimal) -> str:
    """An amount as an axis or a legend shows it: enough digits for small prices."""
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.4f}".rstrip("0").rstrip(".")


def _date_label(day: date, days: int) -> str:
    return day.strftime("%b %d") if days > 7 else day.strftime("%a %b %d")


def spend_chart(
    data: SpendSeries, budget: Decimal = Decimal(0), budget_label: str = ""
) -> SafeString:
    """Stacked columns of cost per day, one colour per series, zero days drawn empty; with a
    `budget`, a dashed line at it (the axis reaches it), labelled `budget_label`."""
    days = data.days
    totals = [float(t) for t in data.day_totals]
    ticks = nice_ticks(max([*totals, float(budget)], default=0.0))
    top = ticks[-1] or 1.0
    colours = _colours(data)
    legend, rows = _legend(data, colours)
    TOP = 18 + LEGEND_ROW * rows  # noqa: N806 - the plot's top edge, below the legend
    HEIGHT = TOP + PLOT_HEIGHT + BOTTOM  # noqa: N806
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT
    slot = plot_w / max(len(days), 1)
    bar_w = max(slot * 0.72, 1.0)
    parts: list[str] = []
    # Grid and amounts.
    for tick in ticks:
        y = TOP + plot_h - plot_h * tick / top
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#ddd" stroke-width="1"/>'
            f'<text class="y-label" x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end" '
            f'font-size="13">{format(tick, ",.10g")}</text>'
        )
    # Dates: at most MAX_DATE_LABELS, evenly spaced back from the last day (today).
    every = max(1, math.ceil(len(days) / MAX_DATE_LABELS))
    for i in range(len(days) - 1, -1, -every):
        day = days[i]
        x = LEFT + slot * (i + 0.5)
        parts.append(
            f'<text class="x-label" x="{x:.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle" '
            f'font-size="13">{escape(_date_label(day, len(days)))}</text>'
        )
    # The columns, series by series (one <g> each, for the legend and for tests).
    base = [0.0] * len(days)
    for series, colour in zip(data.series, colours, strict=True):
        rects = []
        for i, value in enumerate(series.values):
            v = float(value)
            if v <= 0:
                continue
            h = plot_h * v / top
            y = TOP + plot_h - plot_h * base[i] / top - h
            base[i] += v
            x = LEFT + slot * i + (slot - bar_w) / 2
            rects.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{escape(series.label)}, '
                f"{days[i].isoformat()}: {escape(amount(v))}</title></rect>"
            )
        parts.append(f'<g class="series" data-series="{escape(series.label)}">{"".join(rects)}</g>')
    if budget > 0:
        y = TOP + plot_h - plot_h * float(budget) / top
        text = f"{budget_label or 'budget'} {amount(budget)}"
        parts.append(
            f'<g class="budget-line"><line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
            f'y2="{y:.1f}" stroke="#ba2121" stroke-width="2" stroke-dasharray="8 5"/>'
            f'<text x="{WIDTH - RIGHT - 4}" y="{y - 6:.1f}" text-anchor="end" font-size="13" '
            f'fill="#ba2121">{escape(text)}</text></g>'
        )
    # Axes.
    parts.append(
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#666"/>'
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" '
        f'stroke="#666"/>'
    )
    parts.append(legend)
    if not data.series:
        parts.append(
            f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
            f'font-size="15" fill="#666">No spend in this period</text>'
        )
    label = (
        f"Cost per day by {data.stack}, {days[0].isoformat()} to {days[-1].isoformat()}, "
        f"total {amount(data.total)}"
        if days
        else "Cost per day"
    )
    return mark_safe(  # nosec B308 B703 - every text above is escaped, numbers are ours
        f'<svg id="spend-chart" role="img" aria-label="{escape(label)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">'
        f"<title>{escape(label)}</title>{''.join(parts)}</svg>"
    )


def _colours(data: SpendSeries) -> list[str]:
    colours = []
    for i, series in enumerate(data.series):
        colours.append(OTHER_COLOUR if series.label == "other" else PALETTE[i % len(PALETTE)])
    return colours


def _legend(data: SpendSeries, colours: list[str]) -> tuple[str, int]:
    """Rows above the plot: a swatch, the series' name and its total per item, wrapped
    before the period's total on the right; returns the SVG and the number of rows."""
    items, x, row = [], float(LEFT), 0
    right = WIDTH - RIGHT - 180  # room for the total
    for series, colour in zip(data.series, colours, strict=True):
        text = f"{series.label} {amount(series.total)}"
        width = 20 + 7.5 * len(text) + 24
        if x + width > right and x > LEFT:
            x, row = float(LEFT), row + 1
        y = 6 + LEGEND_ROW * row
        items.append(
            f'<g class="legend-item"><rect x="{x:.1f}" y="{y}" width="14" height="14" '
            f'fill="{colour}"/><text x="{x + 20:.1f}" y="{y + 12}" font-size="13">'
            f"{escape(text)}</text></g>"
        )
        x += width
    total = f"total {amount(data.total)}"
    items.append(
        f'<text class="chart-total" x="{WIDTH - RIGHT}" y="18" text-anchor="end" '
        f'font-size="14" font-weight="bold">{escape(total)}</text>'
    )
    return "".join(items), row + 1
