"""Charts as inline SVG drawn on the server: no JavaScript, nothing for the Content-Security-Policy to allow.

Two kinds, enough for the dashboard: :func:`line_chart` (series over time,
one value a bucket) and :func:`bar_chart` (labelled rows of stacked bars).
Each is a ``<figure>`` holding an ``<svg role="img">`` whose ``<title>`` and
``<desc>`` say in words what it shows, and an HTML legend. Every point and
bar has its own ``<title>``, which the browser shows on hover, so exact
values are there without a script. Colours are presentation attributes,
not style: the page needs no inline style for them.

All text is escaped here (:func:`markupsafe.escape`); the result is
:class:`~markupsafe.Markup` for the template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from markupsafe import Markup, escape

WIDTH, HEIGHT = 520, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 12, 28
GRID = "#d8dce4"
INK = "#5b6475"
#: line and bar colours, in the order series take them (dark enough on white for WCAG AA non-text contrast)
PALETTE = ("#1f5fbf", "#1f7a3a", "#a32020", "#8a5a00", "#6a3fa0", "#0f7c8c")
TICKS = 4


@dataclass(frozen=True)
class Series:
    name: str
    values: list
    colour: str
    #: say "N in all" in the description (counts); latencies and levels are not summed
    summed: bool = True


def _number(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}".replace(",", " ")
    return f"{value:.3g}"


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-9):
            return step * power
    return 10 * power  # pragma: no cover - the loop ends at 10


def axis_top(value: float, *, whole: bool) -> float:
    """The top of a y axis over ``value`` whose :data:`TICKS` steps are nice numbers (whole ones for counts)."""
    step = nice_ceiling(value / TICKS)
    return max(step, 1.0) * TICKS if whole else step * TICKS


def _time(value) -> datetime:
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.astimezone(timezone.utc)


def _svg_open(chart_id: str, title: str, description: str, height: int) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" role="img" aria-labelledby="{chart_id}-title {chart_id}-desc" class="chart-svg">',
            f'<title id="{chart_id}-title">{escape(title)}</title>',
            f'<desc id="{chart_id}-desc">{escape(description)}</desc>']


def _legend(entries: list[tuple[str, str]]) -> str:
    items = "".join(f'<li><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" '
                    f'fill="{colour}"/></svg> {escape(text)}</li>' for text, colour in entries)
    return f'<ul class="legend">{items}</ul>'


def _figure(chart_id: str, title: str, svg: list[str], legend: str, note: str | None) -> Markup:
    caption = f'<figcaption>{escape(title)}</figcaption>'
    extra = f'<p class="muted chart-note">{escape(note)}</p>' if note else ""
    return Markup(f'<figure class="chart" id="{chart_id}">{caption}{"".join(svg)}{legend}{extra}</figure>')


def _describe(series: Series, times: list[datetime], unit: str) -> str:
    present = [(v, t) for v, t in zip(series.values, times) if v is not None]
    if not present or not any(v for v, _ in present):
        return f"{series.name}: none."
    peak, when = max(present, key=lambda pair: pair[0])
    text = f"{series.name}: highest {_number(peak)}{unit} at {when:%H:%M} UTC"
    if series.summed:
        text += f", {_number(sum(v for v, _ in present))} in all"
    return text + f", latest {_number(present[-1][0])}{unit}."


def line_chart(chart_id: str, title: str, times: list, series: list[Series], *, unit: str = "",
               tick_every: timedelta, whole: bool = True, note: str | None = None) -> Markup:
    """Series over the buckets that start at ``times``, a value a bucket (``None``: no value).

    The x axis is labelled every ``tick_every``; ``unit`` follows each value;
    ``whole``: the values are counts, so the y axis steps by whole numbers.
    """
    moments = [_time(t) for t in times]
    count = max(len(moments), 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = axis_top(max([v for s in series for v in s.values if v is not None] or [0]), whole=whole)

    def x(index: int) -> float:
        return LEFT + (index + 0.5) * plot_w / count

    def y(value: float) -> float:
        return TOP + plot_h - value / top * plot_h

    span = f"{moments[0]:%Y-%m-%d %H:%M}–{moments[-1]:%H:%M} UTC" if moments else ""
    description = f"{title}, {span}. " + " ".join(_describe(s, moments, unit) for s in series)
    svg = _svg_open(chart_id, title, description, HEIGHT)
    for tick in range(TICKS + 1):
        value = top * tick / TICKS
        svg.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                   f'stroke="{GRID}" stroke-width="1"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="12" '
                   f'fill="{INK}">{escape(_number(value) + unit)}</text>')
    step = tick_every.total_seconds()
    for index, moment in enumerate(moments):
        if moment.timestamp() % step == 0:
            svg.append(f'<line x1="{x(index):.1f}" x2="{x(index):.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" '
                       f'stroke="{INK}"/>')
            svg.append(f'<text x="{x(index):.1f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12" '
                       f'fill="{INK}">{moment:%H:%M}</text>')
    for s in series:
        runs, current = [], []
        for index, value in enumerate(s.values):
            if value is None:
                if current:
                    runs.append(current)
                current = []
            else:
                current.append(f"{x(index):.1f},{y(value):.1f}")
        if current:
            runs.append(current)
        for run in runs:
            if len(run) == 1:  # a lone value between gaps: a dot, a line of one point draws nothing
                cx, cy = run[0].split(",")
                svg.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{s.colour}"/>')
            else:
                svg.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{s.colour}" stroke-width="2" '
                           'stroke-linejoin="round" stroke-linecap="round"/>')
        for index, value in enumerate(s.values):  # hover targets: the exact value of each bucket
            if value is not None:
                label = f"{moments[index]:%H:%M} UTC · {s.name}: {_number(value)}{unit}"
                svg.append(f'<circle cx="{x(index):.1f}" cy="{y(value):.1f}" r="4" fill="{s.colour}" '
                           f'fill-opacity="0"><title>{escape(label)}</title></circle>')
    svg.append("</svg>")
    legend = _legend([(f"{s.name}" + (f" ({_number(sum(v for v in s.values if v is not None))})" if s.summed else ""),
                       s.colour) for s in series])
    return _figure(chart_id, title, svg, legend, note)


def bar_chart(chart_id: str, title: str, rows: list[tuple[str, list[float]]], parts: list[tuple[str, str]], *,
              note: str | None = None) -> Markup:
    """One row per label, its values stacked left to right; ``parts`` names and colours each value."""
    row_h, label_w = 24, 160
    height = TOP + max(len(rows), 1) * row_h + BOTTOM
    plot_w = WIDTH - label_w - RIGHT - 48
    top = axis_top(max([sum(values) for _, values in rows] or [0]), whole=True)
    summary = "; ".join(f"{label}: " + ", ".join(f"{_number(v)} {name}" for v, (name, _) in zip(values, parts))
                        for label, values in rows) or "none"
    svg = _svg_open(chart_id, title, f"{title}. {summary}.", height)
    for index, (label, values) in enumerate(rows):
        y = TOP + index * row_h
        svg.append(f'<text x="{label_w - 8}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end" font-size="12" '
                   f'fill="#1d2330">{escape(label)}</text>')
        left = float(label_w)
        for value, (name, colour) in zip(values, parts):
            width = value / top * plot_w
            if width > 0:
                svg.append(f'<rect x="{left:.1f}" y="{y + 4}" width="{width:.1f}" height="{row_h - 8}" '
                           f'fill="{colour}"><title>{escape(f"{label}: {_number(value)} {name}")}</title></rect>')
            left += width
        svg.append(f'<text x="{left + 6:.1f}" y="{y + row_h / 2 + 4:.1f}" font-size="12" fill="{INK}">'
                   f'{escape(" + ".join(_number(v) for v in values))}</text>')
    base = TOP + max(len(rows), 1) * row_h
    svg.append(f'<line x1="{label_w}" x2="{label_w + plot_w}" y1="{base}" y2="{base}" stroke="{GRID}"/>')
    for tick in range(TICKS + 1):
        value = top * tick / TICKS
        at = label_w + value / top * plot_w
        svg.append(f'<text x="{at:.1f}" y="{base + 16}" text-anchor="middle" font-size="12" fill="{INK}">'
                   f'{escape(_number(value))}</text>')
    svg.append("</svg>")
    return _figure(chart_id, title, svg, _legend([(name, colour) for name, colour in parts]), note)
