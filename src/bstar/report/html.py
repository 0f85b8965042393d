"""One self-contained HTML file: a Report (cards, sections of facts, charts and tables,
assumptions) rendered through a Jinja2 template with inline CSS and inline SVG.

Jinja2 (in the `plot` extra with matplotlib) rather than string.Template: the report loops
over sections, charts and table rows, and Jinja2 escapes every value by default, so a model
name, a file path or a reason string can never turn into markup. The template stays a plain
readable HTML file next to this module.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from bstar import __version__, safeio
from bstar.errors import BstarError
from bstar.report.charts.base import Chart


@dataclass
class Card:
    """A headline number (the recommendation) with its reason and engine flags."""

    label: str
    value: str
    detail: str = ""
    bound: str = ""
    flags: dict[str, str] = field(default_factory=dict)
    tone: str = "good"  # good, warn, bad, info


@dataclass
class Table:
    caption: str
    columns: list[str]
    rows: list[list[str]]
    row_classes: list[str] | None = None
    collapsed: bool = False
    note: str = ""


@dataclass
class Section:
    heading: str
    anchor: str
    intro: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings and notes, one line each


@dataclass
class Report:
    kind: str  # plan, compare, fit, sweep, simulate
    title: str
    subtitle: str = ""
    cards: list[Card] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    command: str = ""
    generated: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC)
                           .strftime("%Y-%m-%d %H:%M UTC"))

    @property
    def charts(self) -> list[Chart]:
        return [c for s in self.sections for c in s.charts]


def _jinja() -> Any:
    try:
        import jinja2
    except ImportError:
        raise BstarError("reports need jinja2: pip install 'bstar[plot]'") from None
    return jinja2


def render_html(report: Report) -> str:
    jinja2 = _jinja()
    files = resources.files("bstar.report") / "templates"
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    tpl = env.from_string((files / "report.html.j2").read_text(encoding="utf-8"))
    css = (files / "report.css").read_text(encoding="utf-8")
    sections = []
    for s in report.sections:
        # A chart is shown no wider than ~1.25x its drawn size, so fonts keep their size.
        charts = [_ChartView(c.name, c.title, c.caption,
                             jinja2.utils.markupsafe.Markup(_inline(c.svg())),
                             round(c.fig.get_figwidth() * 120))
                  for c in s.charts]
        sections.append(_SectionView(s, charts))
    view = _ReportView(report, sections)
    return tpl.render(r=view, css=jinja2.utils.markupsafe.Markup(css), version=__version__)


def _inline(svg: str) -> str:
    # An SVG document embedded in HTML needs no XML prolog or DOCTYPE.
    start = svg.find("<svg")
    return svg[start:] if start > 0 else svg


@dataclass
class _ChartView:
    name: str
    title: str
    caption: str
    svg_markup: Any
    max_width_px: int


class _SectionView:
    def __init__(self, s: Section, charts: list[_ChartView]) -> None:
        self.heading, self.anchor, self.intro = s.heading, s.anchor, s.intro
        self.facts, self.tables, self.charts = s.facts, s.tables, charts
        self.notes = s.notes


class _ReportView:
    def __init__(self, r: Report, sections: list[_SectionView]) -> None:
        self.kind, self.title, self.subtitle, self.cards = r.kind, r.title, r.subtitle, r.cards
        self.assumptions, self.command, self.generated = r.assumptions, r.command, r.generated
        self.sections = sections


def write_html(report: Report, path: str | Path) -> Path:
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise BstarError(f"-o wants an .html file name, got {str(path)!r}")
    if not p.parent.exists():
        raise BstarError(f"folder {str(p.parent)!r} does not exist")
    return safeio.write_output(p, render_html(report).encode("utf-8"), "-o")
