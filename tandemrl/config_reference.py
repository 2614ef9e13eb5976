"""The configuration reference (docs/configuration.md), generated from the config models.

Every key of :class:`tandemrl.config.Config` with its dotted name, type, default and description. Sections are
pydantic models (descriptions from ``Field(description=...)``) or dataclasses (descriptions from
``field(metadata={"description": ...})``); a section's docstring introduces its table.

    python -m tandemrl.config_reference > docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel

from tandemrl.config import Config, toml_literal
from tandemrl.config.base import section_fields

REGENERATE = "python -m tandemrl.config_reference > docs/configuration.md"

_INTRO = f"""# Configuration reference

<!-- Generated from the config models by `{REGENERATE}`. Do not edit by hand:
     change the field's description in the code and regenerate. -->

A run is configured by TOML files (`tandemrl train --config FILE`) plus `--set section.key=value` overrides,
applied in that order over the defaults below. `--config` may be given several times: the files merge in order,
section by section, so a later file changes only the keys it names (`--config base.toml --config big-gpu.toml`); a
key's value, a list or a table-valued key such as `reward.weights`, is replaced whole; `--set` applies on top. Values are TOML literals: `3`, `1e-4`, `true`, `"text"`,
`["a", "b"]`, `{{accuracy = 1.0}}`; a bare word is read as a string. In the Python API, `config=` takes a `Config`,
a dict of dotted overrides (`{{"train.max_steps": 20}}`) or a TOML path.

An unknown key, a wrong type or an impossible value fails before any work starts, naming the key and the valid
choices; an unknown key also names the TOML file or the `--set` it came from, and the closest valid key, or, for a
TRL `GRPOConfig` name such as `learning_rate`, tandemrl's key for it (see [coming from TRL](coming-from-trl.md)).
Paths in a config (`data.path`, `data.test_path`, ...) are relative to the working directory, not to the config
file. `tandemrl config [--config FILE ...] [--set ...]` prints the resolved config as TOML, and every run writes it
to `config.toml` in its directory. A task may bring defaults of its own (e.g. `data.task = "synthetic:peek"` sets
its tools); they fill only the keys you leave out.

In the tables, "unset" means the key has no value (TOML has no null: leave the key out).
"""

# Section introductions where the class docstring is written for developers (a field list, source paths).
_INTROS = {
    "rollout.speculative": "Speculative decoding: proposed tokens are checked by the target model in one forward "
                           "and kept by the rejection rule, so the output follows the target's distribution. See "
                           "[speculative decoding](speculative.md).",
    "rollout.vllm": "`rollout.backend = \"vllm\"`: a colocated `vllm.LLM` in the trainer's process, or (`mode = "
                    "\"server\"`) a vLLM OpenAI server you run, driven over HTTP. See [vLLM](vllm.md).",
    "engine": "How the rollout engine sizes its KV cache and its batches. See [the rollout engine](engine.md).",
    "tandem": "Tandem rollouts: the trained (\"hot\") model and a frozen one write each completion together. See "
              "[tandem rollouts](tandem.md).",
    "tools": "Multi-turn tool calling: on when `tools.names` lists tools (a task may bring its own), unless "
             "`tools.enabled = false`. See [tools](tools.md).",
    "sync": "How the trainer's weights reach a separate process that samples its rollouts. See "
            "[serving](serving.md).",
    "reward.inference": "Serving cost in the reward: total = task score - latency x ms - tokens x generated tokens - "
                        "kv_mb x MB held + accept x acceptance rate + cache_reuse x prefix-cache hit ratio. All 0 (the "
                        "default) = plain GRPO. See [inference-aware reward](inference-reward.md).",
    "curriculum": "Adaptive curriculum: a per-sample reward EMA; after each epoch KDE valleys split the samples into "
                  "difficulty buckets, and harder buckets get more rollouts per prompt. See "
                  "[adaptive curriculum](curriculum.md).",
    "distributed": "Multi-process runs under torchrun (read only when torchrun's `RANK` / `WORLD_SIZE` are set). "
                   "See [multi-GPU](multi-gpu.md).",
}


@dataclass(frozen=True)
class Key:
    """One config key: where it is, what it takes, what it is by default and what it does."""

    name: str  # dotted, e.g. "model.lora.rank"
    type: str
    default: str
    description: str | None


@dataclass(frozen=True)
class SectionDoc:
    name: str  # dotted, e.g. "model.lora"
    doc: str | None
    keys: tuple[Key, ...]


def config_reference() -> str:
    """The configuration reference as markdown (what docs/configuration.md holds)."""
    all_sections = list(sections())
    parts = [_INTRO, "\nSections: " + ", ".join(f"[`{s.name}`](#{_anchor(s.name)})" for s in all_sections) + ".\n"]
    for section in all_sections:
        parts.append(f"\n## `{section.name}`\n")
        doc = _INTROS.get(section.name, section.doc)
        if doc:
            parts.append(f"\n{doc}\n")
        parts.append("\n| key | type | default | description |\n|---|---|---|---|\n")
        for key in section.keys:
            cells = (f"`{key.name}`", _cell(key.type), _cell(key.default), _cell(key.description or ""))
            parts.append("| " + " | ".join(cells) + " |\n")
    return "".join(parts)


def _anchor(name: str) -> str:
    """GitHub's anchor of a `## `name`` heading: lower case, punctuation other than - and _ dropped."""
    return "".join(c for c in name.lower() if c.isalnum() or c in "-_")


def missing_descriptions() -> list[str]:
    """Dotted names of the keys that have no description."""
    return [key.name for section in sections() for key in section.keys if not key.description]


def all_keys() -> list[str]:
    return [key.name for section in sections() for key in section.keys]


def sections(model: type = Config, prefix: str = "") -> Iterator[SectionDoc]:
    """Every section under ``model`` (the top-level Config lists none of its own keys), depth first."""
    keys, nested = [], []
    for spec in section_fields(model):
        dotted = f"{prefix}{spec.name}"
        if _is_section(spec.annotation):
            nested.append((dotted, spec.annotation))
        else:
            keys.append(Key(dotted, _type_name(spec.annotation, _constraints(model, spec.name)), _default(spec.default),
                            spec.description))
    if keys:
        yield SectionDoc(prefix.rstrip("."), _doc(model), tuple(keys))
    for dotted, section in nested:
        yield from sections(section, dotted + ".")


def _is_section(annotation: Any) -> bool:
    return inspect.isclass(annotation) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation))


def _doc(model: type) -> str | None:
    doc = model.__doc__
    if not doc or (dataclasses.is_dataclass(model) and doc.startswith(model.__name__ + "(")):
        return None  # a dataclass without a docstring gets its signature as __doc__
    if issubclass(model, BaseModel) and doc == BaseModel.__doc__:
        return None
    first = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())  # the first paragraph, one line
    return first.replace("``", "`")


def _constraints(model: type, name: str) -> list[str]:
    if not issubclass(model, BaseModel):
        return []
    bounds = ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "≤"),
              (annotated_types.Lt, "lt", "<"))
    out = []
    for meta in model.model_fields[name].metadata:
        for kind, attr, symbol in bounds:
            if isinstance(meta, kind):
                out.append(f"{symbol} {_literal(getattr(meta, attr))}")
        if isinstance(meta, annotated_types.MinLen):
            out.append(f"length ≥ {meta.min_length}")
    return out


def _type_name(annotation: Any, constraints: list[str]) -> str:
    text = _type_text(annotation)
    return f"{text}, {', '.join(constraints)}" if constraints else text


def _type_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(_literal(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if annotation is type(None):
        return "unset"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_text(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(value: Any) -> str:
    return "unset" if value is None else f"`{_literal(value)}`"


def _literal(value: Any) -> str:
    """A value as TOML writes it."""
    try:
        return toml_literal(value)
    except TypeError:
        return str(value)


def _cell(text: str) -> str:
    """Markdown table cell: no line breaks, pipes escaped (those already escaped stay so)."""
    return " ".join(text.split()).replace("\\|", "\0").replace("|", "\\|").replace("\0", "\\|")


if __name__ == "__main__":
    print(config_reference(), end="")
