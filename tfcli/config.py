"""Config files (YAML or TOML) mapped one-to-one onto dataclasses.

Each concern has its own dataclass (`ModelConfig`, `TrainConfig`, ...). A config file is a mapping whose sections
are those dataclasses' names (`model:`, `train:`, ...); CLI flags override single fields. Unknown keys, wrong types
and impossible values are `ConfigError`s with a one-line message, never a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from tfcli.errors import ConfigError

T = TypeVar("T")


def load_config_file(path: os.PathLike | str) -> dict:
    """Read a YAML (.yaml/.yml), TOML (.toml) or JSON file into a dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: invalid UTF-8 (byte 0x{e.object[e.start]:02x}); save the file as UTF-8") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:
        raise ConfigError(f"{path}{_error_line(e)}: cannot parse config: {_parse_message(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of sections (model:, train:, ...)")
    return data


def _error_line(e: Exception) -> str:
    """":LINE" of a YAML, TOML or JSON parser error, where the parser says."""
    mark = getattr(e, "problem_mark", None)  # yaml.MarkedYAMLError
    if mark is not None:
        return f":{mark.line + 1}"
    if isinstance(e, json.JSONDecodeError):
        return f":{e.lineno}"
    toml = re.search(r"\(at line (\d+), column \d+\)", str(e))  # tomllib
    return f":{toml.group(1)}" if toml else ""


def _parse_message(e: Exception) -> str:
    """The parser's complaint on one line, without YAML's quoted snippet of the file."""
    if getattr(e, "problem_mark", None) is not None:
        return ": ".join(filter(None, [getattr(e, "context", None), getattr(e, "problem", None)]))
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} (column {e.colno})"
    return " ".join(str(e).split())


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, where: str):
    """Check `value` against the annotation `tp`, converting only where lossless (int -> float, str -> number)."""
    origin = get_origin(tp)
    if origin is typing.Union or (sys.version_info >= (3, 10) and origin is types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if origin in (list, tuple):
        (item_tp, *_) = get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp in (bool, int, float, str):
        return _scalar(value, tp, where)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")  # pragma: no cover


def _scalar(value: Any, tp: type, where: str):
    """`value` as a bool, int, float or str, converted only where lossless."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(float(value)) if float(value).is_integer() else int(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: expected a string, got {value!r}")


@functools.cache
def _hints(cls: type) -> dict:
    """A config class's field types, resolved once: get_type_hints resolves the annotations anew at every call, a
    large share of a short `Translator.translate` call's overhead."""
    return get_type_hints(cls)


def from_dict(cls: type[T], data: dict | None, where: str = "") -> T:
    """Build dataclass `cls` from `data`, rejecting unknown keys and wrong types; then call its `validate()`."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    aliases = getattr(cls, "ALIASES", {})  # old spellings of keys: {old: new}
    kwargs = {}
    for key, value in data.items():
        key_n = str(key).replace("-", "_")
        path = f"{where}.{key}" if where else str(key)
        if key_n in aliases:
            if aliases[key_n] in data and data[aliases[key_n]] != value:
                raise ConfigError(f"{path}: the old name of {aliases[key_n]}, which is given too; give one")
            key_n = aliases[key_n]
        if key_n not in names:
            close = difflib.get_close_matches(key_n, sorted(names), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{path}: unknown config key{hint}")
        kwargs[key_n] = _coerce(value, hints[key_n], path)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate()
    return obj


def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def override(obj: T, where: str = "", **changes) -> T:
    """A copy of dataclass `obj` with the non-None `changes` applied, type-checked and validated."""
    aliases = getattr(type(obj), "ALIASES", {})
    changes = {aliases.get(k, k): v for k, v in changes.items() if v is not None}
    if not changes:
        return obj
    return from_dict(type(obj), {**to_dict(obj), **changes}, where)


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """Parse `--set section.key=value` items into {section: {key: value}} (values parsed as YAML scalars)."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--set {item}: expected section.key=value, e.g. model.d_model=256")
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = yaml.safe_load(value) if value else ""
    return out


def field_comments(cls) -> dict[str, str]:
    """The `# comment` beside each field in a dataclass's source: the help that `tfcli config` prints."""
    import inspect

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments = {}
    for line in source.splitlines():
        m = re.match(r"\s+(\w+)\s*:[^#]*#\s*(.*)$", line)
        if m and m.group(1) not in comments:
            comments[m.group(1)] = m.group(2).strip()
    return comments


def annotated_yaml(sections: dict[str, Any], skip: dict[str, set[str]] | None = None) -> str:
    """A config file (`section:` -> `key: default  # help`) for the given dataclass instances, which `--config`
    reads back as the same settings."""
    import yaml

    lines = []
    for name, obj in sections.items():
        comments = field_comments(type(obj))
        lines.append(f"{name}:")
        for key, value in to_dict(obj).items():
            if key in (skip or {}).get(name, set()):
                continue
            text = yaml.safe_dump({key: value}, default_flow_style=True, width=10_000).strip()[1:-1].strip()
            row = f"  {text}"
            if comments.get(key):
                row = f"{row:<32}  # {comments[key]}"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)
