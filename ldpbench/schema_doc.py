"""Render config/README.md, the reference of every campaign key, from the campaign schema.

`python -m ldpbench.schema_doc > config/README.md` regenerates it; tests/test_docs.py checks that the
committed file equals the rendering. A training key without a schema default shows the default of its
`TrainingSettings` field, the one place training defaults are written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ldpbench.campaign import DEFAULT_SCHEMA
from ldpbench.fl.settings import TrainingSettings

HEADER = """# Campaign keys

A campaign file is YAML validated against `ldpbench/schemas/config.schema.yaml` before any job
starts (`ldpbench validate FILE`); unknown keys are errors. This page is generated from that schema
by `python -m ldpbench.schema_doc > config/README.md`; a test fails when the two differ. How to
write and run a campaign: [docs/campaigns.md](../docs/campaigns.md). `config/config.yaml` is the
default campaign and `config/campaigns/` holds the paper campaigns.

A key `a[].b` is key `b` of each item of list `a`. A training default marked *(TrainingSettings)*
comes from `ldpbench/fl/settings.py`.

| key | type | allowed | default | meaning |
|---|---|---|---|---|
"""

_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minItems", "at least {} item(s)"),
    ("maxLength", "at most {} characters"),
    ("pattern", "matches `{}`"),
)


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type") or sorted({type(v).__name__.replace("str", "string") for v in node.get("enum", [])})
    kind = kind or "any"
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(str(k) for k in kinds)
    if "array" in kinds and "type" in node.get("items", {}):
        text += f" of {node['items']['type']}"
    return text


def _allowed(node: dict[str, Any]) -> str:
    parts = [template.format(node[name]) for name, template in _BOUNDS if name in node]
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{_value(v)}`" for v in node["enum"]))
    if node.get("uniqueItems"):
        parts.append("unique")
    items = node.get("items", {})
    if node.get("type") == "array" and items.get("type") not in (None, "object"):
        parts.extend(f"each {part}" for part in _allowed(items).split("; ") if part)
    return "; ".join(parts)


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def _training_defaults() -> dict[str, Any]:
    """Field defaults of TrainingSettings (and its nested dataclasses), keyed by dotted key path."""
    defaults: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        for field in dataclasses.fields(cls):
            if field.default is not dataclasses.MISSING:
                defaults[prefix + field.name] = field.default
            elif field.default_factory is not dataclasses.MISSING:
                value = field.default_factory()
                if dataclasses.is_dataclass(value):
                    walk(type(value), prefix + field.name + ".")
                else:
                    defaults[prefix + field.name] = value

    walk(TrainingSettings, "training.")
    return defaults


def _default(path: str, node: dict[str, Any], training: dict[str, Any]) -> str:
    if "default" in node and node["default"] != {}:
        return f"`{_value(node['default'])}`"
    settings_key = path.replace("mechanisms[].", "").replace("datasets[].", "")
    if settings_key in training:
        return f"`{_value(training[settings_key])}` *(TrainingSettings)*"
    return ""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def iter_keys(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every key of the schema as (dotted path, its schema node), parents before children."""
    for name, child in node.get("properties", {}).items():
        path = prefix + name
        yield path, child
        yield from iter_keys(child, path + ".")
        items = child.get("items", {})
        if items.get("type") == "object":
            yield from iter_keys(items, path + "[].")


def render(schema_path: str | Path = DEFAULT_SCHEMA) -> str:
    """The Markdown reference of every key of the campaign schema at `schema_path`."""
    schema = yaml.safe_load(Path(schema_path).read_text(encoding="utf-8"))
    training = _training_defaults()
    required = set(schema.get("required", []))
    rows = []
    for path, node in iter_keys(schema):
        meaning = node.get("description", "")
        if path in required:
            meaning = "**Required.** " + meaning
        row = (f"`{path}`", _type(node), _allowed(node), _default(path, node, training), meaning)
        rows.append("| " + " | ".join(_cell(part) for part in row) + " |")
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
