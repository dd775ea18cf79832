"""The documentation: a short README, links that resolve, a campaign-key reference that cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ldpbench import schema_doc

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
KEYS_PAGE = ROOT / "config" / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
# Records of earlier measurements (benchmarks/results/README.md), linked from the docs.
RECORDS = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
README_LIMIT = 6_000
# The README opens with these two commands: set up and run the default campaign; set up and test.
FIRST_LINES = (
    "# ldpbench",
    "",
    "```bash",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && snakemake --cores 2",
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" '
    "-e examples/ldpbench-plugin-example && pytest",
    "```",
)
# [text](target): targets are taken up to the first space or closing parenthesis (titles are not used here).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for line in FENCE.sub("", markdown).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[str]:
    """Relative links of a Markdown page whose file (or heading anchor, on a Markdown page) is missing."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file of the repository
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{page.name}: {target} (no file {resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text("utf-8")):
            problems.append(f"{page.name}: {target} (no heading #{anchor} in {resolved.name})")
    return problems


def test_readme_is_short():
    assert len(README.read_text(encoding="utf-8")) <= README_LIMIT


def test_readme_opens_with_the_two_commands():
    assert tuple(README.read_text(encoding="utf-8").splitlines()[: len(FIRST_LINES)]) == FIRST_LINES


def test_readme_says_what_ldpbench_is_right_after_the_commands():
    # A reader who stops after the first screen knows what the tool is, not how long it once took.
    after_commands = README.read_text(encoding="utf-8").splitlines()[len(FIRST_LINES):]
    first_paragraph = " ".join(after_commands[1:after_commands.index("", 1)])
    assert after_commands[0] == ""
    assert first_paragraph.startswith("ldpbench runs ")
    assert "local-differential-privacy" in first_paragraph and "federated learning" in first_paragraph


def test_readme_links_every_docs_page_and_the_key_reference():
    linked = {target.partition("#")[0] for target in LINK.findall(README.read_text(encoding="utf-8"))}
    expected = {f"docs/{page.name}" for page in DOC_PAGES} | {"config/README.md"}
    assert expected - linked == set()


@pytest.mark.parametrize("page", [README, KEYS_PAGE, *DOC_PAGES, *RECORDS],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    assert broken_links(page) == []


def test_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-heading) [web](https://example.org/x) [gone](missing.md) "
                    "[no anchor](other.md#nowhere)\n```\n[in code](also-missing.md)\n```\n", encoding="utf-8")
    problems = broken_links(page)
    assert len(problems) == 2
    assert "missing.md" in problems[0] and "#nowhere" in problems[1]


def test_key_reference_is_generated_from_the_schema():
    # Regenerate with: python -m ldpbench.schema_doc > config/README.md
    assert KEYS_PAGE.read_text(encoding="utf-8") == schema_doc.render()


def test_workflow_catalog_file_declares_usage():
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text(encoding="utf-8"))
    usage = catalog["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert set(usage["mandatory-flags"]) == {"desc", "flags"}
    assert usage["software-stack-deployment"] == {"conda": True}
    assert usage["report"] is True
