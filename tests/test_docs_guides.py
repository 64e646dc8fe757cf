"""README.md and the guides under docs/ (not docs/results/ nor docs/studies/) read as
guides for users: no UTC times, load averages, issue numbers, dates or "this round"
(issue 36, item 8). Dated measurements and histories belong in docs/results/ pages (dated
in one header line) or CHANGELOG.md.

A citation is not history: the date of a published source, or another project's issue
or pull request, is allowed when the text just before it names that source (a commit
hash, a repository, a URL, "published", "blog", "PR", ...); see ``_citation``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FORBIDDEN = {
    "a clock time": re.compile(r"(?<![\d.:/\w])(?:[01]\d|2[0-3]):[0-5]\d(?![\d:])"),
    "UTC": re.compile(r"\bUTC\b"),
    "a machine load": re.compile(
        r"\bload averages?\b|(?<!mean )(?<!max )\bload (?:about |of |)\d+(?:\.\d+)?\b"
        r"(?!\s*(?:rps|req|requests|tokens))|\b(?:loaded|idle|busy) (?:\d-core )?machine",
        re.I),
    "an issue number": re.compile(r"\bissues? (?:#)?\d+|(?<![\w&/#])#\d+\b", re.I),
    "a date": re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b"),
    "a history word": re.compile(
        r"\b(?:(?:before|until|since|after|in) this round|this round|earlier today|"
        r"today'?s?|yesterday|this (?:morning|afternoon|evening))\b", re.I),
}
# what, just before a date or an issue number, makes it a citation of another source
CITATION = re.compile(
    r'https?://\S*$|["\u201d],?\s*$|'
    r"\b[0-9a-f]{7,40}\b|commit|published|blog|README|\bPR\b|pull request|"
    r"paper|arXiv|release|posted|LMSYS|DeepGEMM|DeepEP|nccl-tests|NCCL|vLLM|SGLang|"
    r"Megatron|TransformerEngine|FlashMLA|PyTorch|added in|"
    # another repository (owner/name), not one of moesim's own folders
    r"(?<![\w/.-])(?!(?:docs|tests|benchmarks|moesim|scenarios|traces|topologies|notebooks|"
    r"results|studies|out)/)[A-Za-z][\w.-]*/[A-Za-z][\w.-]*", re.I)


def _citation(line: str, start: int) -> bool:
    return bool(CITATION.search(line[max(0, start - 90):start]))


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line, what, matched text) of everything a guide must not hold."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        for what, pat in FORBIDDEN.items():
            for m in pat.finditer(line):
                if what in ("a date", "an issue number") and _citation(line, m.start()):
                    continue
                out.append((no, what, m.group(0)))
    return out


def test_the_checker_finds_history_and_lets_citations_through():
    page = "\n".join([
        "Measured 2026-12-02 14:02 UTC at load average 1.3.",           # 1
        "The engine before issue 25 took 3 s (see #25); before this round 4 s.",   # 2
        "28.3 s at load 2, on an idle 2-core machine.",                  # 3
        "DeepGEMM's issue #125 (2025-07-21); commit fa0315ae2 (2025-10-10).",   # 4
        '<https://lmsys.org/blog/2025-05-05-large-scale-ep>: "A title", 2025-05-05',  # 5
        "experts: max/mean load 3.20, 22:1 ratio, 1:30 tokens, step 14.02 ms",  # 6
        "benchmarks/bench_rl.py on 2026-12-02, docs/rl.md as of 2026-12-01",   # 7
    ])
    got = [(n, w) for n, w, _ in findings(page)]
    assert got == [(1, "a clock time"), (1, "UTC"), (1, "a machine load"), (1, "a date"),
                   (2, "an issue number"), (2, "an issue number"), (2, "a history word"),
                   (3, "a machine load"), (3, "a machine load"), (7, "a date"), (7, "a date")], got


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_guides_hold_no_dates_times_loads_or_issue_numbers(page):
    bad = [f"{page.relative_to(ROOT)}:{n}: {what}: {hit!r}"
           for n, what, hit in findings(page.read_text())]
    assert not bad, ("move dated figures and history into docs/results/ or CHANGELOG.md:\n"
                     + "\n".join(bad))


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation other than
    '-' and '_' dropped, spaces as '-'; a repeated heading gets '-1', '-2', ..."""
    out, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    bad, fenced = [], False
    for no, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):       # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                bad.append(f"{no}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
                bad.append(f"{no}: {target}: no such heading")
    return bad


def test_heading_anchors_as_github_makes_them(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Fast path: a model (issue 7)\n```\n# not a heading\n```\n"
                    "## `moesim run`\n## `moesim run`\n")
    assert heading_anchors(page) == {"fast-path-a-model-issue-7", "moesim-run", "moesim-run-1"}


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_heading_that_exist(page):
    # pages move and headings get renamed: a link must still land
    assert broken_links(page) == []
