"""The report's HTML: Jinja2 templates (ldpbench/results/templates/, shipped with the package) rendered with
autoescaping on, so that every value from the tables, the campaign or the claims files is escaped where it is
written; only the sections and macros the templates render themselves are inserted as they are.

The code builds what a section shows (its tables as rows of cell text, its numbers); the templates hold the
page, its words and its markup.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

from ldpbench.layout import figure_link


@dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]
    best: bool = False  # shown in bold


@dataclass(frozen=True)
class Table:
    """A table as the page shows it: its header and its rows of cell text (templates/macros.html.j2; sortable
    by a click on a column's header, templates/sort.js)."""

    columns: tuple[str, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Figure:
    """A figure embedded in the page (a data URI: the page shows it wherever it is opened, inside Snakemake's
    report or MLflow's artifact view too), with links to its SVG and PNG files."""

    png_base64: str
    alt: str
    links: tuple[tuple[str, str], ...]  # (label, href)


def cell_text(value, digits: int = 4) -> str:
    """A table cell: floats to `digits` significant digits, NaN and None as "–", infinity as "∞"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def table(frame: pd.DataFrame, best: pd.Series | None = None) -> Table:
    """`frame` as the page shows it; rows where `best` is True are marked."""
    marks = [False] * len(frame) if best is None else [bool(mark) for mark in best]
    return Table(tuple(str(column) for column in frame.columns),
                 tuple(Row(tuple(cell_text(value) for value in row), mark)
                       for row, mark in zip(frame.itertuples(index=False), marks)))


def figure(png: Path, alt: str) -> Figure:
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return Figure(data, alt, tuple((form.upper(), figure_link(png, form)) for form in ("svg", "png")))


@cache
def environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("ldpbench.results", "templates"), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    # `{{ value | number(".2f") }}`: a number as an f-string's format spec writes it.
    environment.filters["number"] = format
    return environment


def render(template: str, **context) -> Markup:
    """The template with its context, as markup another template inserts as it is. A template's last newline
    is dropped (Jinja2's default), so a section ends where its last line does."""
    return Markup(environment().get_template(template).render(**context))
