"""The documents a newcomer reads first stay true to the tree: every file they name exists, every
relative link resolves (anchors included), and the README stays short."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} - {"var", "node_modules"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
# Paths a document names that are made at run time, not kept in the tree.
GENERATED = ("var/", "~/", "/")


def _anchors(markdown: str) -> set[str]:
    anchors = set(re.findall(r'<a id="([^"]+)"', markdown))
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _named_path(text: str) -> str | None:
    """The repository path a code span names, or None when it names something else."""
    path = text.split("#", 1)[0].split("::", 1)[0].rstrip(".,:;")
    if not path or path.startswith(GENERATED) or any(c in path for c in "*<>{}$=()|"):
        return None
    if path.partition("/")[0] not in TOP_LEVEL or ("/" not in path and "." not in path):
        return None
    return path


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_a_document_names_exists(document):
    missing = sorted(
        {
            path
            for text in CODE.findall(document.read_text())
            if (path := _named_path(text)) and not (ROOT / path).exists()
        }
    )
    assert not missing, f"{document.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{document.name} has links that resolve to nothing: {broken}"


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_comment_that_cites_a_document_points_at_an_anchor_it_has():
    cited = re.compile(r"((?:docs/[\w.-]+|README|CONTRIBUTING)\.md)#([\w-]+)")
    broken, stale = [], []
    for source in ROOT.glob("**/*.py"):
        if {".venv", "var", "node_modules"} & set(source.relative_to(ROOT).parts):
            continue
        text = source.read_text()
        where = source.relative_to(ROOT)
        for document, anchor in cited.findall(text):
            file = ROOT / document
            if not file.exists() or anchor not in _anchors(file.read_text()):
                broken.append(f"{where}: {document}#{anchor}")
        if re.search(r"README, " + "Figures", text):
            stale.append(str(where))
    assert not broken, f"citations of anchors that do not exist: {broken}"
    assert not stale, f"comments citing the README's old Figures section: {stale}"
