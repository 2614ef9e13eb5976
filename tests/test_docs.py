"""The user docs stay true: the configuration reference is the generated one, every key is described, the README
stays short, and no page names a path outside the repository or links to a file that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tandemrl.config_reference import REGENERATE, all_keys, config_reference, missing_descriptions

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 260

# A path outside the repository: a parent directory, this machine's work tree, the project's shared folder.
OUTSIDE = re.compile(r"\.\./|/work/|(?<![\w-])shared/")
# [text](target) and [text]: target; images too. Targets with a scheme or only an anchor are not files.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def user_docs() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_configuration_reference_is_generated():
    page = DOCS / "configuration.md"
    assert page.is_file(), f"docs/configuration.md is missing; write it with: {REGENERATE}"
    assert page.read_text() == config_reference(), (
        f"docs/configuration.md is not what the config models generate; regenerate it with: {REGENERATE}")


def test_every_config_key_has_a_description():
    missing = missing_descriptions()
    assert not missing, (
        "config keys without a description (add Field(..., description=...) or, in a dataclass section, "
        f"field(..., metadata={{'description': ...}})), then regenerate with `{REGENERATE}`: {', '.join(missing)}")


def test_reference_lists_every_key():
    page = config_reference()
    absent = [key for key in all_keys() if f"| `{key}` |" not in page]
    assert not absent, f"keys missing from the reference: {absent}"


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move details to a page under docs/")


@pytest.mark.parametrize("page", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_path_outside_the_repository(page: Path):
    bad = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
           for n, line in enumerate(page.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not bad, "a user doc names a path outside the repository:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(page: Path):
    broken = []
    for match in LINK.finditer(page.read_text()):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, an anchor in the same page
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_docs_pages_exist():
    pages = ["engine", "tandem", "speculative", "inference-reward", "curriculum", "tools", "serving", "vllm",
             "multi-gpu", "checkpoints", "configuration", "coming-from-trl"]
    missing = [p for p in pages if not (DOCS / f"{p}.md").is_file()]
    assert not missing, f"docs pages missing: {missing}"
