"""What every config section shares: unknown keys are errors, numbers are plain finite numbers."""

from __future__ import annotations

import dataclasses
import math
import typing
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import (BaseModel, ConfigDict, ValidationError, ValidationInfo, ValidatorFunctionWrapHandler,
                      field_validator)
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    """The base of every pydantic section: an unknown key is an error, an assignment is validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="wrap")
    @classmethod
    def _plain_numbers(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """Numbers are numbers: pydantic's lax mode would read `true` as 1 (lr = true trained at lr 1.0) and "0.5"
        as 0.5; and no setting here means anything at inf or nan. An int stays valid where a float is expected."""
        # a boolean is refused before the range checks, whose message ("should be >= 2 (got True)") would mislead
        early = isinstance(value, bool) and _takes_numbers_not_bools(cls.model_fields[info.field_name].annotation)
        problem = ((), value, "expected a number, not a boolean") if early else None
        result = None if early else handler(value)
        problem = problem or _coerced_number(value, result, ())
        if problem is not None:
            loc, got, message = problem
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": PydanticCustomError("plain_number", message), "loc": loc, "input": got}])
        return result

    def differs_from_default(self, name: str) -> bool:
        """Whether key ``name`` holds a value other than its default. A run's config.toml writes every key, defaults
        included, so a check that asks "did the user set this?" asks this instead."""
        return getattr(self, name) != type(self).model_fields[name].default


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One key of a section class: what the error messages, the no-effect checks and the reference read."""

    name: str
    annotation: Any  # the type, resolved (a nested section is its class)
    default: Any
    description: str | None


def section_fields(section: Any) -> list[FieldSpec]:
    """The keys of a section class, a pydantic model's or a plain dataclass's, in the order it declares them; []
    for anything else."""
    if isinstance(section, type) and issubclass(section, BaseModel):
        return [FieldSpec(name, info.annotation, info.get_default(call_default_factory=True), info.description)
                for name, info in section.model_fields.items()]
    if isinstance(section, type) and dataclasses.is_dataclass(section):
        hints = typing.get_type_hints(section)
        return [FieldSpec(f.name, hints[f.name], _dataclass_default(f), f.metadata.get("description"))
                for f in dataclasses.fields(section)]
    return []


def _dataclass_default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def check_dataclass_section(section: Any, own_prefix: str, key_prefix: str) -> None:
    """Run the ``validate()`` of a plain-dataclass section (engine, tandem, speculative: they live beside the code
    that reads them), its messages reworded to name the config's keys: ``own_prefix`` (e.g. "EngineConfig.")
    becomes ``key_prefix`` (e.g. "engine.")."""
    try:
        section.validate()
    except ValueError as err:
        raise ValueError(str(err).replace(own_prefix, key_prefix)) from None


def _takes_numbers_not_bools(annotation: Any) -> bool:
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return bool not in members and any(m in (int, float) for m in members)


def _coerced_number(given: Any, result: Any, loc: tuple) -> tuple[tuple, Any, str] | None:
    """(where, the value, why) for the first number in `result` that was not a plain finite number in `given`.
    Walks lists, tuples, dicts and dataclass sections; a nested Section has checked itself."""
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        if isinstance(given, bool):
            return loc, given, "expected a number, not a boolean"
        if isinstance(given, (str, bytes)):
            return loc, given, "expected a number, not a string (write it without quotes)"
        if isinstance(result, float) and not math.isfinite(result):
            return loc, given, "expected a finite number"
        return None
    if isinstance(result, (list, tuple)) and isinstance(given, (list, tuple)) and len(given) == len(result):
        pairs = [(i, g, r) for i, (g, r) in enumerate(zip(given, result))]
    elif isinstance(result, dict) and isinstance(given, dict):
        pairs = [(k, given[k], r) for k, r in result.items() if k in given]
    elif dataclasses.is_dataclass(result) and isinstance(given, dict):
        pairs = [(f.name, given[f.name], getattr(result, f.name)) for f in dataclasses.fields(result) if f.name in given]
    else:
        return None
    for key, g, r in pairs:
        if (problem := _coerced_number(g, r, (*loc, key))) is not None:
            return problem
    return None
