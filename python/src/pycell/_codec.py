"""JSON <-> dataclasses, field by field, as pycelld's Rust codec does it:
each field has a JSON type, and says when it is left out of the JSON
(`omit`, set by `pycell._fields.field`: when None, when empty, when
false, when zero). Decoding checks
every type; unknown fields are an error when `strict` (the protocol
vectors' test), kept in `extra` otherwise (a newer daemon's additions).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

from pycell.errors import ProtocolError

T = TypeVar("T")
Json = Any

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _omitted(rule: str | None, value: Any) -> bool:
    if rule == "none":
        return value is None
    if rule == "empty":
        return not value
    if rule == "false":
        return value is False
    if rule == "zero":
        return bool(value == 0)
    return False


def to_json(value: Any) -> Json:
    """A dataclass (or a list, dict or scalar of them) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Json] = {}
        for f in dataclasses.fields(value):
            if f.name == "extra":
                continue
            v = getattr(value, f.name)
            if _omitted(f.metadata.get("omit"), v):
                continue
            out[f.name] = to_json(v)
        out.update(getattr(value, "extra", None) or {})
        return out
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Json, *, strict: bool = False, where: str = "") -> T:
    """`data` decoded as dataclass `cls`; ProtocolError names what is wrong."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = set(fields) - {"extra"}
    unknown = {k: v for k, v in data.items() if k not in known}
    if unknown and strict:
        raise ProtocolError(f"{where}: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for name in known:
        f = fields[name]
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], strict, f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field {name!r}")
    if "extra" in fields:
        kwargs["extra"] = unknown
    return cls(**kwargs)


def _convert(tp: Any, value: Json, strict: bool, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, strict, where)
        raise ProtocolError(f"{where}: unsupported union {tp}")
    if tp is Any:
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, strict, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        _, item = typing.get_args(tp)
        return {k: _convert(item, v, strict, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_json(tp, value, strict=strict, where=where)  # type: ignore[arg-type]
    return _scalar(tp, value, where)


def _scalar(tp: Any, value: Json, where: str) -> Any:
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise ProtocolError(f"{where}: unsupported type {tp}")
    if not ok:
        raise ProtocolError(f"{where}: expected {tp.__name__}, got {value!r:.60}")
    return value
