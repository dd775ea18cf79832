"""The project's YAML documents read and checked: a file read safely, its values bounded and finite,
validated against a JSON Schema with the defaults filled in, every error naming the file and the key.

Used for the campaign file (`ldpbench.campaign`) and the paper claims files (`ldpbench.scorecard`).
It imports nothing of ldpbench but its errors, so reading a document costs no registry import and
ties no module that reads one to the campaign's.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import stat
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ldpbench.errors import ConfigError

# A campaign file is a few hundred values; YAML aliases can make a short file expand to billions
# ("billion laughs"), so the expanded size is measured on the shared object graph and bounded.
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 32
# A campaign or paper claims file is a few kilobytes; a larger one (or a device such as /dev/zero)
# is a mistake that would otherwise be read until memory runs out.
MAX_FILE_BYTES = 4 * 2**20
INT64_MAX = 2**63 - 1  # run tables store integers as int64

KeyName = Callable[[Iterable[Any]], str]  # how an error names the key at a path
SchemaAt = Callable[[dict[str, Any], list[Any]], dict[str, Any]]  # the schema of the value at a path


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The YAML document of a project file (`what` names it in errors: "campaign file", "paper claims
    file"), loaded safely: a regular file of at most MAX_FILE_BYTES, UTF-8 text.

    Opened without blocking (a named pipe would otherwise wait for a writer) and checked on the
    opened file, so what is read is what was checked.
    """
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise ConfigError(f"{what} '{path}': not a regular file (a device, pipe or directory)")
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{what} '{path}': cannot read it ({error.strerror or error})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{what} '{path}': larger than {MAX_FILE_BYTES // 2**20} MiB; such a file is a few "
                          f"kilobytes of YAML")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what} '{path}': not UTF-8 text (byte {data[error.start]:#04x} at offset "
                          f"{error.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{what} '{path}' is not valid YAML: {_one_line(error)}") from None
    except RecursionError:
        raise ConfigError(f"{what} '{path}': nested more than {MAX_CONFIG_DEPTH} levels deep") from None


def _one_line(error: yaml.YAMLError) -> str:
    """A YAML error as one line: what is wrong and where (PyYAML's own text spans several lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return problem if mark is None else f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


def format_path(path: Iterable[Any]) -> str:
    """A key path as written in errors: `datasets[0].training.lr`; `<top level>` for the empty path."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top level>"


def read_schema(path: str | Path) -> dict[str, Any]:
    """A JSON Schema file (YAML), as a copy of its own: the file is parsed once per version (modification
    time and size), where every validation parsed it again (most of a validation's time)."""
    path = Path(path).resolve()
    status = path.stat()
    return copy.deepcopy(_parsed_schema(str(path), status.st_mtime_ns, status.st_size))


@functools.lru_cache(maxsize=8)
def _parsed_schema(path: str, modified_ns: int, size: int) -> dict[str, Any]:
    # libyaml's parser where PyYAML has it: the same document, parsed several times faster; every
    # Snakemake parses the campaign schema once. A user's documents keep the Python parser's messages.
    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def validator_with_defaults(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """A validator of `schema` that also fills in each property's `default` where the value lacks it."""
    base = jsonschema.validators.validator_for(schema)
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, subschema):
        if isinstance(instance, dict):
            for key, prop in properties.items():
                if "default" in prop:
                    instance.setdefault(key, copy.deepcopy(prop["default"]))
        yield from validate_properties(validator, properties, instance, subschema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})(schema)


@dataclass
class _AliasGraph:
    """What a walk of the loaded document learns: expanded sizes and use counts of its blocks."""

    key: KeyName  # names a key in an error
    sizes: dict[int, int] = dataclasses.field(default_factory=dict)  # by id(): values once written out
    uses: dict[int, int] = dataclasses.field(default_factory=dict)  # by id(): references to the block
    active: set[int] = dataclasses.field(default_factory=set)  # blocks being measured (cycle check)
    visits: int = 0  # each visit adds at least one value to the expanded size

    def measure(self, node: Any, path: list[Any]) -> int:
        """Values under `node` as if every YAML alias were written out; a shared block is walked once.

        Stops early once more values were met than accepted: a block already expanded (as
        Snakemake's config merge does with mapping aliases) shares nothing.
        """
        self.visits += 1
        if self.visits > MAX_CONFIG_VALUES:
            raise ConfigError(f"{self.key(path[:2])}: the document holds more than {MAX_CONFIG_VALUES:,} values")
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        self.uses[key] = self.uses.get(key, 0) + 1
        if key in self.sizes:
            return self.sizes[key]
        if key in self.active:
            raise ConfigError(f"{self.key(path)}: refers to itself (a recursive YAML alias)")
        if len(path) >= MAX_CONFIG_DEPTH:
            raise ConfigError(f"{self.key(path)}: nested more than {MAX_CONFIG_DEPTH} levels deep")
        self.active.add(key)
        children = node.items() if isinstance(node, dict) else enumerate(node)
        total = 1 + sum(self.measure(child, [*path, part]) for part, child in children)
        self.active.discard(key)
        self.sizes[key] = total
        return total


def check_expanded_size(document: Any, key: KeyName) -> None:
    """Refuse a document whose aliases expand to more than MAX_CONFIG_VALUES values, naming the key.

    The sizes are computed on the loaded object graph (YAML aliases are shared objects), so a
    billion-laughs block costs as much to measure as it costs to write. The key named (by `key`) is
    the outermost one holding the excess that is not itself an alias.
    """
    graph = _AliasGraph(key)
    total = graph.measure(document, [])
    sizes, uses = graph.sizes, graph.uses
    if total <= MAX_CONFIG_VALUES:
        return
    node, path = document, []
    while isinstance(node, (dict, list)):
        children = list(node.items() if isinstance(node, dict) else enumerate(node))
        part, child = max(children, key=lambda item: sizes.get(id(item[1]), 1))
        if sizes.get(id(child), 1) <= MAX_CONFIG_VALUES or uses.get(id(child), 0) > 1:
            break
        node, path = child, [*path, part]
    size = sizes.get(id(node), total)
    raise ConfigError(f"{key(path)}: expands to {size:.3g} values (YAML aliases written out); at most "
                      f"{MAX_CONFIG_VALUES:,} are accepted")


def subschema(schema: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    """The schema of the value at `path` ({} where the schema leaves it open)."""
    node = schema
    for part in path:
        if isinstance(part, int):
            node = node.get("items", {})
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            node = node.get("additionalProperties", {})
        if not isinstance(node, dict):
            return {}
    return node


def _allowed_range(schema: dict[str, Any]) -> str:
    """E.g. 'a number in (0, 1]' from the schema's bounds; '' where it has none."""
    if not {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} & set(schema):
        return ""
    low = f"[{schema['minimum']}" if "minimum" in schema else f"({schema.get('exclusiveMinimum', '-∞')}"
    high = f"{schema['maximum']}]" if "maximum" in schema else f"{schema.get('exclusiveMaximum', '∞')})"
    kind = "an integer" if schema.get("type") == "integer" else "a number"
    return f"{kind} in {low}, {high}"


def schema_message(error: jsonschema.ValidationError) -> str:
    """What a schema error says, a bound written as the allowed range and a length as a count."""
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"must be {_allowed_range(error.schema)}, got {error.instance!r}"
    if error.validator == "maxLength":
        return f"must be at most {error.validator_value} characters long, got {len(error.instance)}"
    return error.message


def _walk(node: Any, path: list[Any]) -> Iterable[tuple[list[Any], Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _walk(child, [*path, key])
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _walk(child, [*path, index])


def check_numbers(document: Any, schema: dict[str, Any], key: KeyName,
                  infinity_allowed: Container[tuple[str, ...]] = frozenset(), schema_at: SchemaAt = subschema) -> None:
    """Every number finite (+∞ only at the keys of `infinity_allowed`, list indices left out) and every
    integer within int64, naming the key (by `key`) and the range the schema (`schema_at` a path) allows.

    JSON Schema's bounds let NaN through (every comparison with NaN is false), so this walks the
    whole document, including what the schema leaves open (e.g. mechanism and network parameters).
    """
    for path, value in _walk(document, []):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        allowed = _allowed_range(schema_at(schema, path))
        if isinstance(value, float) and not math.isfinite(value):
            named = tuple(part for part in path if not isinstance(part, int))
            if value == math.inf and named in infinity_allowed:
                continue
            raise ConfigError(f"{key(path)}: must be a finite number"
                              f"{f' ({allowed})' if allowed else ''}, got {value!r}")
        if isinstance(value, int) and abs(value) > INT64_MAX:
            raise ConfigError(f"{key(path)}: must be "
                              f"{allowed or f'an integer in [-{INT64_MAX}, {INT64_MAX}]'}, got {value}")


def validate_document(document: Any, schema_path: str | Path, source: str,
                      infinity_allowed: Container[tuple[str, ...]] = frozenset()) -> Any:
    """Validate a YAML document of the project (e.g. paper claims) against its schema, filling
    defaults; raise ConfigError naming `source` (its file) and the key path.

    As a campaign config: its expanded size first (YAML aliases), then every number finite (+∞ only
    at the keys of `infinity_allowed`, as for `check_numbers`), then the schema.
    """
    def key(path: Iterable[Any]) -> str:
        return f"{source}, key '{format_path(path)}'"

    check_expanded_size(document, key)
    document = copy.deepcopy(document)
    schema = read_schema(schema_path)
    check_numbers(document, schema, key, infinity_allowed)
    errors = sorted(validator_with_defaults(schema).iter_errors(document),
                    key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        lines = [f"key '{format_path(e.absolute_path)}': {schema_message(e)}" for e in errors[:10]]
        raise ConfigError(f"invalid {source}:\n  " + "\n  ".join(lines))
    return document
