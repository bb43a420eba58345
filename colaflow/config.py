"""YAML → dataclass configuration shared by every stage, with ``key=value`` overrides.

Each component owns one dataclass with defaults that work on a laptop; a YAML file
fills some fields and command-line overrides such as ``optim.lr=3e-4`` fill others.
Values of overrides are parsed as YAML scalars (``true``, ``1e-3``, ``[1, 2]``).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type."""


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Check/convert a scalar for a field typed exactly ``int``, ``float``, ``bool`` or ``str``.

    YAML 1.1 (PyYAML) reads ``3e-4`` as a string, so numeric strings are converted;
    ``1.0`` is accepted for an int field, ``1`` for a float field. Other types pass unchanged.
    """
    if hint not in (int, float, bool, str):
        return value
    if hint is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if hint is bool and isinstance(value, bool):
        return value
    if hint in (int, float) and not isinstance(value, bool) and isinstance(value, (int, float, str)):
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            number = None
        if hint is float and number is not None:
            return float(number)
        if hint is int and number is not None and float(number).is_integer():
            return int(number)
    article = "an" if hint.__name__[0] in "aeiou" else "a"
    raise ConfigError(f"config key {name!r} needs {article} {hint.__name__}, got {value!r}")


def from_dict(cls: type[T], data: dict | None, where: str = "") -> T:
    """Build dataclass ``cls`` from a nested dict, recursing into dataclass-typed fields.

    Fields typed exactly ``int``/``float``/``bool``/``str`` are checked and converted
    (``"3e-4"`` → ``0.0003`` for a float field, since YAML 1.1 reads it as a string).

    Raises:
        ConfigError: unknown key (the message lists the valid ones), or a value of the wrong type.
    """
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean {where + close[0]!r}? " if close else ""
            raise ConfigError(f"unknown config key {where + key!r}; {hint}valid keys: {', '.join(sorted(fields))}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            value = from_dict(hint, value, f"{where}{key}.")
        else:
            value = _coerce(value, hint, where + key)
        kwargs[key] = value
    return cls(**kwargs)


def to_dict(obj) -> dict:
    """Plain nested dict of a config dataclass (for saving beside runs and checkpoints)."""
    return dataclasses.asdict(obj)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set ``a.b.c=value`` overrides into a nested dict (in place); returns it.

    Raises:
        ConfigError: an override is not of the form ``key=value``.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (example: optim.lr=3e-4)")
        dotted, raw = item.split("=", 1)
        node = data
        *parents, last = dotted.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node[last] = yaml.safe_load(raw)
    return data


def load_config(cls: type[T], path: str | None = None, overrides: list[str] | None = None) -> T:
    """Load dataclass ``cls`` from a YAML file (optional) plus overrides.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: unknown keys or malformed overrides.
    """
    data: dict = {}
    if path:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    return from_dict(cls, apply_overrides(data, overrides or []))
