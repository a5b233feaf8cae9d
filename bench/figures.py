"""A figure of ``make bench``: attache's number beside its reference from the same run, and its target."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One measured figure.

    ``reference_value`` is the reference measured in the same run (its
    ratio is printed); a figure held to an absolute bound has none.
    ``at_least``/``at_most`` is the target: on the ratio when there is a
    reference, else on the value.
    """

    measure: str
    value: float
    unit: str
    reference: str = ""
    reference_value: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.reference_value is None or not self.reference_value:
            return None
        return self.value / self.reference_value

    @property
    def target(self) -> str:
        suffix = "x" if self.reference_value is not None else f" {self.unit}"
        if self.at_least is not None:
            return f">= {self.at_least:g}{suffix}"
        if self.at_most is not None:
            return f"<= {self.at_most:g}{suffix}"
        return ""

    @property
    def met(self) -> bool | None:
        judged = self.ratio if self.reference_value is not None else self.value
        if judged is None:
            return None
        if self.at_least is not None:
            return judged >= self.at_least
        if self.at_most is not None:
            return judged <= self.at_most
        return None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated; with fewer samples than 100, p99 is near the maximum."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def table(figures: list[Figure]) -> str:
    """The side-by-side table, one line per figure, as Markdown (it reads as plain text too)."""
    lines = ["| measure | attache | reference (same run) | ratio | target | met |",
             "|---|---|---|---|---|---|"]
    for f in figures:
        reference = f"{f.reference}: {f.reference_value:.2f} {f.unit}" if f.reference_value is not None \
            else f.reference
        ratio = f"{f.ratio:.2f}" if f.ratio is not None else ""
        met = {True: "yes", False: "**no**", None: ""}[f.met]
        note = f" ({f.note})" if f.note else ""
        lines.append(f"| {f.measure}{note} | {f.value:.2f} {f.unit} | {reference} | {ratio} | {f.target} | {met} |")
    return "\n".join(lines)
