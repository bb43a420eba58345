"""YAML → dataclass configuration shared by every stage, with ``key=value`` overrides.

Each component owns one dataclass with defaults that work on a laptop; a YAML file
fills some fields and command-line overrides such as ``optim.lr=3e-4`` fill others.
Values of overrides are parsed as YAML scalars (``true``, ``1e-3``, ``[1, 2]``).

What a field accepts is declared beside it: ``lr: float = setting(3e-3, gt=0)``,
``norm: str = setting("rmsnorm", choices=("rmsnorm", "layernorm"))``. :func:`check_fields`
checks every declared field of a config and its sections in one pass; each config's
``validate`` calls it first, then checks the relations between its fields.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type or range."""


@dataclasses.dataclass(frozen=True)
class Check:
    """The values one config field accepts (declared with :func:`setting`): bounds for a number
    (``ge``/``gt`` below, ``le``/``lt`` above; ``None`` = unbounded), a tuple of ``choices``, or a
    ``pattern`` (a regular expression the whole string must match)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple = ()
    pattern: str = ""

    def describe(self) -> str:
        """What to use, for a message: ``one of a, b``, ``a number >= 0``, ``a number in (0, 1]``,
        ``a string matching [a-z]+``."""
        if self.choices:
            return f"one of {', '.join(map(str, self.choices))}"
        if self.pattern:
            return f"a string matching {self.pattern}"
        low, high = (self.ge if self.ge is not None else self.gt), (self.le if self.le is not None else self.lt)
        if high is None:
            return f"a number {'>=' if self.ge is not None else '>'} {low}"
        if low is None:
            return f"a number {'<=' if self.le is not None else '<'} {high}"
        return f"a number in {'[' if self.ge is not None else '('}{low}, {high}{']' if self.le is not None else ')'}"

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is allowed (``None``, an optional field's "not set", always is)."""
        if value is None:
            return True
        if self.choices:
            return value in self.choices
        if self.pattern:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
            choices: tuple = (), pattern: str = "") -> Any:
    """A dataclass field whose accepted values are declared beside it (see :class:`Check`).

    Args:
        default / default_factory: as for ``dataclasses.field``.
        ge, gt, le, lt: bounds of a number (``>=``, ``>``, ``<=``, ``<``).
        choices: the values an enumerated field accepts.
        pattern: a regular expression a string field must match whole.
    Returns:
        the ``dataclasses.field``, its :class:`Check` in ``metadata["check"]``.
    """
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"check": Check(ge, gt, le, lt, tuple(choices), pattern)})


def declared_checks(config: Any, where: str = "") -> dict[str, Check]:
    """Every declared :class:`Check` of ``config`` (a dataclass instance) and its dataclass
    sections, by dotted key (``optim.lr``)."""
    out: dict[str, Check] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update(declared_checks(value, f"{where}{f.name}."))
        elif "check" in f.metadata:
            out[where + f.name] = f.metadata["check"]
    return out


def check_fields(config: Any, where: str = "") -> None:
    """Check every declared field of ``config`` and of its dataclass sections (one pass).

    Args:
        config: a config dataclass instance.
        where: the dotted prefix of its keys in messages (``"data."`` for a section checked alone).
    Raises:
        ConfigError: one line naming the first bad key, its value and what to use, e.g.
            ``optim.min_lr=-0.0001: use a number >= 0``.
    """
    for key, check in declared_checks(config, where).items():
        node = config
        for part in key[len(where):].split("."):
            node = getattr(node, part)
        if not check.accepts(node):
            raise ConfigError(f"{key}={node!r}: use {check.describe()}")


_SCALARS = (int, float, bool, str)


def _type_name(hint: Any) -> str:
    """``an int``, ``a list``, ``a mapping``, ``a str or None``: what a field needs, for a message."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        text = " or ".join("None" if a is type(None) else _type_name(a).split(" ", 1)[1]
                           for a in typing.get_args(hint))
        return f"{'an' if text[0] in 'aeiou' else 'a'} {text}"
    base = origin or hint
    if isinstance(base, type) and issubclass(base, (list, tuple, set, frozenset)) and base is not str:
        return "a list"
    if isinstance(base, type) and issubclass(base, dict):
        return "a mapping"
    name = getattr(base, "__name__", str(base))
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _flow(value: Any) -> str:
    """``value`` as a one-line YAML flow value (``[en]``, ``{a: 1}``), for an example in a message."""
    try:
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
    except yaml.YAMLError:
        return repr(value)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Check/convert a value for a field typed ``int``, ``float``, ``bool``, ``str``, a list
    (``list``, ``list[str]``, ``tuple[int, ...]``), a mapping (``dict``, ``dict[int, float]``) or a
    union of those with ``None`` (``str | None``).

    YAML 1.1 (PyYAML) reads ``3e-4`` as a string, so numeric strings are converted;
    ``1.0`` is accepted for an int field, ``1`` for a float field. A list field refuses a scalar
    (``language.allowed=en`` would otherwise be taken as the "list" of its characters) and its
    elements are checked when the type names them; likewise a mapping field. An empty value
    (``key=`` or ``key:`` with nothing after it) is refused unless the field may be ``None``.
    Other types pass unchanged.

    Raises:
        ConfigError: one line naming the key and what to give.
    """
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        for a in members:  # already of one of the types: as it is (bool is no int here)
            if a in _SCALARS and type(value) is a or (a is float and type(value) is int):
                return float(value) if a is float else value
        if value is None:
            raise ConfigError(f"config key {name!r} is empty: give {_type_name(hint)}, e.g. {name}=VALUE")
        for a in members:
            try:
                return _coerce(value, a, name)
            except ConfigError:
                continue
        return value  # the config's own validate names what to use (tokenizer.add_bos: true, false or null)
    base = origin or hint
    if isinstance(base, type) and base is not str and issubclass(base, (list, tuple)):
        if value is None:
            raise ConfigError(f"{name}: empty; give a list, e.g. {name}=[a, b] ({name}=[] for none)")
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: needs a list, e.g. {name}={_flow([value])}; got {value!r}")
        if base is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):  # tuple[int, str]
            if len(value) != len(args):
                raise ConfigError(f"{name}: needs a list of {len(args)} values, got {len(value)}: {_flow(list(value))}")
            value = [_coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        elif args:  # list[str], tuple[int, ...]: one type for every element
            value = [_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)]
        return tuple(value) if base is tuple else list(value)
    if isinstance(base, type) and issubclass(base, dict):
        if value is None:
            raise ConfigError(f"{name}: empty; give a mapping, e.g. {name}={{key: value}} ({name}={{}} for none)")
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: needs a mapping, e.g. {name}={{key: value}}; got {value!r}")
        if len(args) == 2:
            return {_coerce(k, args[0], f"{name} key {k!r}"): _coerce(v, args[1], f"{name}.{k}")
                    for k, v in value.items()}
        return value
    if hint not in _SCALARS:
        return value
    if value is None:
        what = "a str" if hint is str else _type_name(hint)
        extra = f" ({name}='' for an empty string)" if hint is str else ""
        raise ConfigError(f"config key {name!r} is empty: give {what}, e.g. {name}=VALUE{extra}")
    if hint is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if hint is str and isinstance(value, bool):
        raise ConfigError(f"config key {name!r} needs a str, got {value!r} (YAML reads yes/no/on/off/true/false "
                          "as booleans: quote the word, e.g. 'no')")
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
        raise ConfigError(f"{where.rstrip('.') or cls.__name__}: expected a mapping, got {type(data).__name__}")
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
        try:
            node[last] = yaml.safe_load(raw)
        except yaml.YAMLError:  # '*', '[a': no YAML value; the text as typed is what was meant
            node[last] = raw
    return data


def _example_section(cls: type) -> str:
    """``tokenizer: {vocab_size: 32000}``: one section of ``cls`` and one of its fields with the
    default, for a message about a file that is not a mapping (the key of ``cls`` when it has no
    section)."""
    first = None
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            for g in dataclasses.fields(default):
                value = getattr(default, g.name)
                if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                    return f"{f.name}: {{{g.name}: {_flow(value)}}}"
        elif first is None and default is not dataclasses.MISSING and isinstance(default, (int, float, str)):
            first = f"{f.name}: {_flow(default)}"
    return first or "key: value"


def load_config(cls: type[T], path: str | None = None, overrides: list[str] | None = None) -> T:
    """Load dataclass ``cls`` from a YAML file (optional) plus overrides.

    Raises:
        ConfigError: ``path`` does not exist or is a folder (``--config PATH: no such file``), ``path`` is not a YAML mapping (naming the line and column of a syntax error),
            unknown keys or malformed overrides.
    """
    data: dict = {}
    if path:
        if not os.path.exists(path):
            raise ConfigError(f"--config {path}: no such file; check the path")
        if os.path.isdir(path):
            raise ConfigError(f"--config {path}: is a folder, not a YAML file; give the file")
        with open(path, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                raise ConfigError(f"{path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}; "
                                  "fix the file") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{path} holds a YAML {type(data).__name__}, not a mapping of sections "
                              f"(e.g. {_example_section(cls)}); fix the file")
    return from_dict(cls, apply_overrides(data, overrides or []))
