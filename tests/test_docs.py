"""The documentation: a short README, links that resolve, a campaign-key reference that cannot drift, and
no measurement history (commit hashes, issue numbers of a tracker outside the repository) in the prose."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
import yaml

from ldpbench import schema_doc
from ldpbench.results import schema as columns

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
KEYS_PAGE = ROOT / "config" / "README.md"
TABLES_PAGE = ROOT / "docs" / "tables.md"
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


def test_table_reference_is_generated_from_the_column_map():
    # Regenerate with: python -m ldpbench.results.schema > docs/tables.md
    assert TABLES_PAGE.read_text(encoding="utf-8") == columns.render()


def test_workflow_catalog_file_declares_usage():
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text(encoding="utf-8"))
    usage = catalog["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert set(usage["mandatory-flags"]) == {"desc", "flags"}
    assert usage["software-stack-deployment"] == {"conda": True}
    assert usage["report"] is True


# The scan for measurement history covers the README, the hand-written docs pages, the Python sources
# (package, benchmarks, tests, example plugin), the Snakefile, the workflow's files and CI's scripts. Left
# out, and why:
# - docs/analysis.md and docs/findings.md: written by `ldpbench findings` (ldpbench/results/findings.py)
#   from the scorecards and docs/templates/; what they say about a campaign is their generator's.
# - benchmarks/results/*.md: the records of earlier measurements, where a commit is the provenance.
# - Python string literals other than docstrings (for commit hashes): data, such as the checksums of
#   the data registries and the run and cell ids of the tests' fixtures.
# - config/ (campaign files, paper claims): data, not prose about the code.
GENERATED_PAGES = {"analysis.md", "findings.md"}
WORKFLOW_TEXT = {".smk", ".py", ".yaml", ".yml", ".sh", ".rst"}
# What a commit hash looks like: 7 to 40 lower-case hex digits, at least one of each kind, standing alone.
# Not matched, by construction: hex literals (0x1f...: the x is a letter next to the digits), sha256
# values (64 digits), ids inside a word or a file name (resnet18-f37072fd.pth: a hyphen before it).
HASH_LIKE = re.compile(r"(?<![\w-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
# A file's checksum named as one ("sha256 f37072fd…", "md5: 00d2c5…") is data, not history.
CHECKSUM_LABEL = re.compile(r"(?:sha1|sha256|md5)\W{0,3}$", re.IGNORECASE)
# The word issue(s) and a number, with a # or an opening parenthesis between them or not: a reference
# to a tracker that is not in the repository. An upstream reference names its repository
# (snakemake/snakemake#3744) and is not matched, nor is an address (.../issues/12).
ISSUE_NUMBER = re.compile(r"\bissues?\s*\(?#?\d+", re.IGNORECASE)

def prose_pages() -> list[Path]:
    """The README and the hand-written docs pages: every line of them is prose."""
    return [README, *(page for page in DOC_PAGES if page.name not in GENERATED_PAGES)]


def source_files() -> list[Path]:
    """Python and Snakemake sources, and the rest of the workflow's files (profiles, envs, captions)."""
    python = [path for pattern in ("ldpbench/**/*.py", "benchmarks/*.py", "tests/**/*.py", "examples/**/*.py")
              for path in ROOT.glob(pattern)]
    workflow = [path for path in (ROOT / "workflow").rglob("*") if path.suffix in WORKFLOW_TEXT]
    ci = [path for path in (ROOT / ".ci").iterdir() if path.is_file()]
    return sorted({*python, *workflow, *ci, ROOT / "Snakefile"})


def python_comments_and_docstrings(source: str) -> str:
    """A Python file's comments and docstrings, one a line: its other strings are data (checksums in
    the data registries, run and cell ids in the tests' fixtures), which may look like hashes."""
    comments = [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    docstrings = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(source))
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return "\n".join(comments + docstrings)


def commit_hashes(text: str) -> list[str]:
    """The hash-like tokens of a text that no checksum label names."""
    return [match.group() for match in HASH_LIKE.finditer(text)
            if not CHECKSUM_LABEL.search(text[max(0, match.start() - 12):match.start()])]


def history_in(path: Path) -> list[str]:
    """Commit hashes and tracker issue numbers in a file's prose (a Python file: hashes in its comments
    and docstrings, issue numbers anywhere), each named with the file."""
    text = path.read_text(encoding="utf-8")
    prose = python_comments_and_docstrings(text) if path.suffix == ".py" else text
    name = path.relative_to(ROOT)
    return ([f"{name}: commit hash {token}" for token in commit_hashes(prose)]
            + [f"{name}: {match.group()}" for match in ISSUE_NUMBER.finditer(text)])


def test_no_commit_hash_or_issue_number_in_docs_or_sources():
    # Measurement history lives in git and in benchmarks/results/; the docs and comments say what is
    # and why. A reference to this project's tracker means nothing to a reader of the repository.
    found = [problem for path in [*prose_pages(), *source_files()] for problem in history_in(path)]
    assert found == []


def test_history_scan_finds_hashes_and_issue_numbers_but_not_data():
    assert commit_hashes("measured at commit `caef0b7` (and 73d6b1e).") == ["caef0b7", "73d6b1e"]
    assert commit_hashes("full 0123456789abcdef0123456789abcdef01234567 end") != []
    not_hashes = ("deadbeef 1234567 0x1f2e3d4c5b resnet18-f37072fd.pth sha256 f37072fd… md5: 00d2c5bc6d35e2 "
                  "run_id=abc1234x " + "ab12" * 16)
    assert commit_hashes(not_hashes) == []
    source = 'HEX = "0123456789abcdef"  # the cell of 5f23b2c\n\ndef f():\n    """Since e349a8b."""\n'
    assert commit_hashes(python_comments_and_docstrings(source)) == ["5f23b2c", "e349a8b"]
    word = "issue"  # spelt apart, so that this file passes its own scan
    text = f"{word} 17, {word}s 14 and ({word} #3), the performance {word} (17); snakemake/snakemake#3744, {word}s/12"
    assert [match.group() for match in ISSUE_NUMBER.finditer(text)] == [f"{word} 17", f"{word}s 14", f"{word} #3",
                                                                       f"{word} (17"]


CAMPAIGN_ROW = re.compile(r"^\| `(config/campaigns/[a-z0-9-]+\.yaml)` \|.*?([\d,]+) (?:final )?runs", re.MULTILINE)


def test_the_campaign_tables_run_counts_are_their_files(monkeypatch):
    """docs/campaigns.md's table of campaigns states each file's number of final runs: a test, so that a
    file edited (a seed, an ε) and its row cannot drift apart."""
    from ldpbench.campaign import count_runs, load_config

    monkeypatch.chdir(ROOT)  # the campaign files name their claims files relative to the checkout
    rows = CAMPAIGN_ROW.findall((ROOT / "docs" / "campaigns.md").read_text(encoding="utf-8"))
    assert len(rows) >= 9
    stated = {path: int(count.replace(",", "")) for path, count in rows}
    assert stated == {path: count_runs(load_config(ROOT / path)) for path in stated}
