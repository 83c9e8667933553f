"""specs/ reads on its own: no path out of the repository, the seed's text inside it, each seed
requirement opened in a sentence with its decisions, and a requirement's words found on its
clause rather than on the format's example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.spec_report.specs import parse_specs

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
SEED = SPECS / "seed-requirements.txt"
RELATIVE = re.compile(r"(?<![\w/.])((?:\.\./)+[\w./-]*)")
LINK = re.compile(r"\]\((?P<target>[^)\s#]*)(?:#(?P<anchor>[^)\s]*))?\)"
                  r"|^\[[^\]]+\]:\s*(?P<ref>[^\s#]*)(?:#(?P<refanchor>\S*))?", re.M)
REFERENCE = re.compile(r"^\[(?P<name>[^\]]+)\]:\s*(?P<page>[\w-]+\.md)#(?P<anchor>\S+)$", re.M)
# A few of the seed's own words, and the clause a reader searching for them must find.
SEARCHES = {
    "at most twenty": "REQ-0065.2",
    "skip locked": "REQ-0065.4",
    "oldest": "REQ-0065.3",
    "never retried": "REQ-0065.5",
    "stop event": "REQ-0065.6",
    "two identical posts": "REQ-0064.4",
    "time scope is not checked": "REQ-0063.5",
    "rate-limited": "REQ-0066.3",
    "clears a previous": "REQ-0067.5",
}


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def pages() -> list[Path]:
    return sorted(SPECS.glob("*.md"))


@pytest.mark.clause("SPECS-1")
def test_no_spec_page_names_a_path_outside_the_repository() -> None:
    """SPECS-1: every relative path and link in specs/ resolves inside the repository to a file
    that exists, every anchor to a heading of its page, and no absolute path is named."""
    problems = []
    for page in pages():
        text = page.read_text()
        for found in RELATIVE.findall(text):
            target = (SPECS / found).resolve()
            if not target.is_relative_to(ROOT) or not target.exists():
                problems.append(f"{page.name}: {found} is not a path in the repository")
        for match in LINK.finditer(text):
            target, anchor = match["target"] or match["ref"], match["anchor"] or match["refanchor"]
            if target and re.match(r"^[a-z]+:", target):
                continue  # a web address: not a path
            resolved = (SPECS / target).resolve() if target else page
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                problems.append(f"{page.name}: the link to {target} leaves the repository or names nothing")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{page.name}: no heading of {resolved.name} has the anchor #{anchor}")
        problems += [f"{page.name}: names the absolute path {path}"
                     for path in re.findall(r"(?<![\w:])/(?:work|home|tmp)/\S+", text)]
    assert problems == []


@pytest.mark.clause("SPECS-2")
def test_the_seeds_text_is_in_specs_and_each_of_its_requirements_heads_a_group_of_clauses() -> None:
    """SPECS-2: specs/seed-requirements.txt holds the seed's words, and each of its requirement
    lines (REQ-0063 to REQ-0067) is word for word the heading of a group of clauses."""
    lines = [line for line in SEED.read_text().splitlines() if re.match(r"^REQ-\d{4} — ", line)]
    assert [line.split()[0] for line in lines] == ["REQ-0063", "REQ-0064", "REQ-0065", "REQ-0066", "REQ-0067"]
    groups = {group.title: group for group in parse_specs(SPECS).groups.values()}
    for line in lines:
        assert line in groups, line
        assert groups[line].clauses and all(cid.startswith(line.split()[0] + ".") for cid in groups[line].clauses)


@pytest.mark.clause("SPECS-3")
def test_each_seed_requirement_opens_with_the_requirement_in_a_sentence_and_links_its_decisions() -> None:
    """SPECS-3: each REQ-0063..0067 group opens with "The requirement: ..." and links at least
    one decision, each link naming a decision and landing on its heading."""
    specs = parse_specs(SPECS)
    seed = [group for group in specs.groups.values() if group.requirement]
    assert [group.requirement for group in seed] == ["REQ-0063", "REQ-0064", "REQ-0065", "REQ-0066", "REQ-0067"]
    for group in seed:
        assert group.opening.startswith("The requirement: "), group.title
        links = REFERENCE.findall(group.opening)
        assert links, f"{group.title}: links no decision"
        for name, page, anchor in links:
            assert name in specs.clauses and name.startswith("DEC-"), name
            assert f"[{name}]" in group.opening.split("\n\n")[0], f"{name} is defined but not cited"
            assert page == specs.clauses[name].page and anchor in anchors(SPECS / page), (name, anchor)


@pytest.mark.clause("SPECS-4")
def test_a_search_for_a_requirements_words_lands_on_its_clause_not_on_the_format_example() -> None:
    """SPECS-4: searching specs/ for the seed's words finds the clause that restates them among
    the clause headings, and never the example of specs/README.md, which is no clause."""
    specs = parse_specs(SPECS)
    readme = (SPECS / "README.md").read_text().lower()
    for words, expected in SEARCHES.items():
        assert words in SEED.read_text().lower() or words in specs.clauses[expected].words.lower(), words
        hits = [cid for cid, clause in specs.clauses.items() if words in clause.words.lower()]
        assert expected in hits, (words, hits)
        assert words not in readme, f"specs/README.md matches {words!r}"
    example = re.search(r"^ {4}### (\S+)", (SPECS / "README.md").read_text(), re.M)
    assert example is not None and example[1] not in specs.clauses
