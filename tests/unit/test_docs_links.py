"""Every relative link in README.md and docs/*.md reaches an existing file and, with a #fragment,
an existing heading of that page, named as GitHub names it: so moving a section cannot leave a
dangling link behind."""

import re
from collections import Counter
from pathlib import Path

import pytest

from api.settings import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+).*?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The page without its code: a `# comment` in a shell block is no heading, a `[x](y)` in code no link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation other than - and _ dropped,
    spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", FENCE.sub("", page.read_text()), re.M):
        name = anchor(heading)
        found.add(f"{name}-{seen[name]}" if seen[name] else name)
        seen[name] += 1
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_pages_have_links_to_check() -> None:
    """The checks below cannot pass by reading nothing: the README links to every docs page."""
    readme = {t.split("#")[0] for t in links(REPO_ROOT / "README.md")}
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= readme


def test_anchor_follows_githubs_rules() -> None:
    assert anchor("Financial controls: resolution catalogue and four eyes") == (
        "financial-controls-resolution-catalogue-and-four-eyes"
    )
    assert anchor("Comparing two revisions without the noise: `make bench-instructions`") == (
        "comparing-two-revisions-without-the-noise-make-bench-instructions"
    )
    assert anchor("1. Install on each API host") == "1-install-on-each-api-host"
    assert anchor("Libraries, and why") == "libraries-and-why"
    assert anchor("snake_case and A–B") == "snake_case-and-ab"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_reaches_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and (dest.suffix != ".md" or fragment not in anchors(dest)):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO_ROOT)}")
    assert not broken, f"{page.relative_to(REPO_ROOT)}:\n" + "\n".join(broken)
