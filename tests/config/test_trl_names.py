"""TRL's GRPOConfig names: the table behind the unknown-key hint agrees with docs/coming-from-trl.md, and every key it
names is a real config key."""

from __future__ import annotations

import re
from pathlib import Path

from tandemrl.config.loading import set_key, unknown_keys
from tandemrl.config.trl_names import TRL_NAMES, trl_hint

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md"
TICKED = re.compile(r"`([^`]*)`")
NAME = re.compile(r"[a-z][a-z0-9_]*")
KEY = re.compile(r"[a-z_]+(?:\.[a-z_]+)+")


def docs_rows() -> list[tuple[set[str], str]]:
    """(the TRL names of the row, its tandemrl cell) for every row of the page's `GRPOConfig` tables."""
    rows = []
    in_grpo_config = False
    for line in PAGE.read_text().splitlines():
        if line.startswith("### "):
            in_grpo_config = "`GRPOConfig`" in line
        if not (in_grpo_config and line.startswith("| `")):
            continue
        trl, tandemrl = line.split(" | ")[:2]
        trl = re.sub(r"\s\([^)]*\)", "", trl)  # "(1e-6)", "(transformers `generate`)": defaults and asides
        names = {m.group(0) for t in TICKED.findall(trl) if (m := NAME.match(t))}
        rows.append((names, tandemrl))
    return rows


def test_the_page_has_the_tables():
    rows = docs_rows()
    assert len(rows) > 40 and any("learning_rate" in names for names, _ in rows)


def test_every_trl_name_on_the_page_has_a_hint_and_no_other():
    on_page = set().union(*(names for names, _ in docs_rows()))
    assert sorted(on_page - set(TRL_NAMES)) == [], "add these to tandemrl/config/trl_names.py"
    assert sorted(set(TRL_NAMES) - on_page) == [], "add these to docs/coming-from-trl.md's GRPOConfig tables"


def test_each_key_of_a_hint_is_the_pages_key_for_that_name():
    rows = docs_rows()
    for name, entry in TRL_NAMES.items():
        on_page = set().union(*(set(KEY.findall(" ".join(TICKED.findall(cell)))) for names, cell in rows
                                if name in names))
        missing = set(entry.keys) - on_page
        assert not missing, f"{name}: {sorted(missing)} is not what docs/coming-from-trl.md gives ({sorted(on_page)})"
        if not entry.keys:  # "no tandemrl key" must be what the page says too
            assert not on_page, f"{name}: the page names {sorted(on_page)}"


def test_every_key_of_a_hint_exists():
    for name, entry in TRL_NAMES.items():
        for key in entry.keys:
            raw: dict = {}
            set_key(raw, key, 1, name)
            assert unknown_keys(raw) == [], f"{name}: {key} is not a config key"


def test_the_hint_reads():
    assert trl_hint("learning_rate") == "TRL's learning_rate is tandemrl's train.lr"
    assert trl_hint("report_to") == "TRL's report_to is tandemrl's log.tensorboard or log.wandb_project"
    assert trl_hint("model_init_kwargs") == ("TRL's model_init_kwargs is tandemrl's model.dtype, "
                                             "model.attn_implementation or model.trust_remote_code")
    assert trl_hint("lr") is None
