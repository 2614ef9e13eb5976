"""Every example config validates as it ships (its keys, values and combinations), and names no path outside
the repository."""

from pathlib import Path

import pytest

from tandemrl.config import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_validates(path):
    load_config(path)
    assert "../" not in path.read_text()


def test_there_are_examples():
    assert len(EXAMPLES) >= 4
