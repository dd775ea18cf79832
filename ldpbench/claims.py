"""The papers' claims (config/paper_claims/*.yaml): read, validated and expanded one per ε.

Apart from the scorecard (ldpbench.scorecard, which judges them against a campaign's runs) so that
the campaign's own check of its claims files, at parse time, imports neither the statistics nor the
tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ldpbench.errors import ConfigError
from ldpbench.validation import read_yaml_file, validate_document

SCHEMA = Path(__file__).resolve().parent / "schemas" / "paper_claims.schema.yaml"
# Where +∞ is a documented value: `epsilon: .inf` reads a non-private reference (list indices left out).
INFINITY_ALLOWED = {("claims", "epsilon")}


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str  # the claim's id in its file
    source: str  # the table or figure
    statement: str
    dataset: str
    model: str
    epsilon: float  # the ε it is read at (for a growth, the largest of its list)
    epsilons: tuple[float, ...]  # a growth's list of ε; (epsilon,) otherwise
    metric: str
    relation: str
    mechanisms: tuple[str, ...]
    value: float  # NaN for an order
    tolerance: float
    substitution: str
    claims_file: str



def load_claims(paths: list) -> list[Claim]:
    """Every claim of the files, one per ε, validated (ConfigError naming the file and key).

    A file is read as a campaign file is (a regular file of a few MB at most, UTF-8, safe YAML), and
    its numbers must be finite: a NaN value or an infinite tolerance would be scored as if meant.
    """
    claims = []
    for path in map(Path, paths):
        document = read_yaml_file(path, "paper claims file")
        document = validate_document(document, SCHEMA, f"paper claims file '{path}'", INFINITY_ALLOWED)
        seen = set()
        for index, entry in enumerate(document["claims"]):
            where = f"paper claims file '{path}', key 'claims[{index}]'"
            if entry["id"] in seen:
                raise ConfigError(f"{where}: the id '{entry['id']}' is used twice")
            seen.add(entry["id"])
            needs = 1 if entry["relation"] in ("value", "increases") else 2
            if len(entry["mechanisms"]) != needs:
                raise ConfigError(f"{where}: a '{entry['relation']}' claim names {needs} mechanism(s), "
                                  f"got {entry['mechanisms']}")
            if (entry["relation"] in ("order", "increases")) == ("value" in entry):
                raise ConfigError(f"{where}: " + (f"a '{entry['relation']}' claim has no 'value'" if "value" in entry
                                                  else f"a '{entry['relation']}' claim needs a 'value'"))
            epsilons = entry["epsilon"] if isinstance(entry["epsilon"], list) else [entry["epsilon"]]
            if entry["relation"] == "increases":
                if len(epsilons) < 2:
                    raise ConfigError(f"{where}: an 'increases' claim needs a list of at least two ε")
                groups = [sorted(map(float, epsilons))]
            else:
                groups = [[float(epsilon)] for epsilon in epsilons]
            for group in groups:
                claims.append(Claim(
                    paper=document["paper"], claim=entry["id"], source=entry["source"],
                    statement=entry["statement"], dataset=entry["dataset"], model=entry["model"],
                    epsilon=group[-1], epsilons=tuple(group), metric=entry["metric"], relation=entry["relation"],
                    mechanisms=tuple(entry["mechanisms"]), value=float(entry.get("value", math.nan)),
                    tolerance=float(entry["tolerance"]), substitution=entry["substitution"],
                    claims_file=path.name))
    return claims
