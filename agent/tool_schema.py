"""A tool's JSON Schema derived from its Python signature (type hints and docstring), and a
call's arguments checked against that schema and converted to what the hints say. Knows
nothing of running tools (:mod:`agent.tools`)."""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

_SECTION = re.compile(r"(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?):")
_ARG_LINE = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
_PARAM_LINE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$", re.M)


@dataclass(slots=True, frozen=True)
class Signature:
    """What a function's signature tells of it as a tool: the docstring's first paragraph
    (``summary``), the JSON Schema of its ``parameters``, the parameter that receives the
    context (``context_param``), how each argument's JSON value is converted (``convert``)
    and the optional parameters without a default (``fill_none``)."""

    summary: str
    parameters: dict[str, Any]
    context_param: str | None
    convert: dict[str, Callable[[Any], Any]]
    fill_none: tuple[str, ...]


def from_signature(
    fn: Callable[..., Any], name: str, parameters: dict[str, Any] | None, context: type
) -> Signature:
    """``fn`` described as the tool ``name``: the schema from its type hints, or
    ``parameters`` (checked to be an object schema) when given. A parameter annotated
    ``context`` (the runner's context class) is left out of the schema. A TypeError names
    what cannot be described."""
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool {name}: cannot read its signature ({exc})") from None
    hints = _hints(fn, name, parameters is None, context)
    where = f"tool {name}"
    properties: dict[str, Any] = {}
    required: list[str] = []
    convert: dict[str, Callable[[Any], Any]] = {}
    fill_none: list[str] = []
    context_param = None
    for p in sig.parameters.values():
        hint = hints.get(p.name, p.annotation)
        if _is_context(hint, context):
            context_param = p.name
            continue
        if parameters is not None:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"{where}: parameter {p.name!r}: a tool's parameters are passed by "
                            "name (no *args, **kwargs or positional-only parameters)")
        if hint is inspect.Parameter.empty:
            raise TypeError(f"{where}: parameter {p.name!r} has no type hint — annotate it "
                            "(str, int, float, bool, list[...], Literal[...], ...)")
        schema, nullable, conv = _schema(hint, f"{where}: parameter {p.name!r}")
        if "description" not in schema and arg_docs.get(p.name):
            schema["description"] = arg_docs[p.name]
        if p.default is not inspect.Parameter.empty:
            default = p.default.value if isinstance(p.default, enum.Enum) else p.default
            if isinstance(default, str | int | float | bool):
                schema["default"] = default
        elif nullable:
            fill_none.append(p.name)
        else:
            required.append(p.name)
        properties[p.name] = schema
        if conv is not None:
            convert[p.name] = conv
    if parameters is None:
        parameters = {"type": "object", "properties": properties, "required": required,
                      "additionalProperties": False}
    elif not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise TypeError(f"{where}: parameters must be a JSON Schema object "
                        '({"type": "object", "properties": {...}})')
    return Signature(summary, parameters, context_param, convert, tuple(fill_none))


def _hints(fn: Callable[..., Any], name: str, strict: bool, context: type) -> dict[str, Any]:
    target = fn if inspect.isroutine(fn) or isinstance(fn, type) else type(fn).__call__
    try:
        # the context's class resolves even where the tool's module imports it for type
        # checking only
        return typing.get_type_hints(target, localns={context.__name__: context},
                                     include_extras=True)
    except Exception as exc:
        if not strict:
            return {}
        raise TypeError(f"tool {name}: cannot resolve its type hints ({type(exc).__name__}: "
                        f"{exc}) — import the types they name at module level") from None


def _is_context(hint: Any, context: type) -> bool:
    if hint is context or hint == context.__name__:
        return True
    if get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in get_args(hint) if a is not type(None)]
        return len(rest) == 1 and rest[0] is context
    return False


_SCALARS: dict[Any, tuple[str, Callable[[Any], Any] | None]] = {
    str: ("string", None), int: ("integer", int), float: ("number", float),
    bool: ("boolean", None),
}


def _schema(hint: Any, where: str) -> tuple[dict[str, Any], bool, Callable[[Any], Any] | None]:
    """``hint`` as (JSON Schema, whether None is allowed, how to convert a JSON value)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        schema, nullable, conv = _schema(args[0], where)
        text = next((a for a in args[1:] if isinstance(a, str)), None)
        if text:
            schema["description"] = text
        return schema, nullable, conv
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            schema, _, conv = _schema(rest[0], where)
            return schema, True, (None if conv is None else
                                  lambda v, c=conv: None if v is None else c(v))
        raise TypeError(f"{where}: a union of {', '.join(map(_type_name, rest))} cannot be "
                        "described — use one type (X | None is fine)")
    if hint in _SCALARS:
        kind, conv = _SCALARS[hint]
        return {"type": kind}, False, conv
    if hint is list or origin is list:
        if not args:
            return {"type": "array"}, False, None
        item, _, conv = _schema(args[0], where)
        return {"type": "array", "items": item}, False, (
            None if conv is None else lambda v, c=conv: [c(x) for x in v])
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: a JSON object's keys are strings: use dict[str, ...]")
        if len(args) == 2 and args[1] is not Any:
            value, _, _ = _schema(args[1], where)
            return {"type": "object", "additionalProperties": value}, False, None
        return {"type": "object"}, False, None
    if origin is Literal:
        kinds = {_json_type(a) for a in args}
        if None in kinds or len(kinds) != 1:
            raise TypeError(f"{where}: Literal values must all be strings, or all numbers, "
                            f"or all booleans, not {args!r}")
        return {"type": kinds.pop(), "enum": list(args)}, False, None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        kinds = {_json_type(v) for v in values}
        if not values or None in kinds or len(kinds) != 1:
            raise TypeError(f"{where}: the Enum {hint.__name__}'s values must all be strings "
                            "or all numbers")
        return {"type": kinds.pop(), "enum": values}, False, hint
    raise TypeError(f"{where}: cannot describe {_type_name(hint)} in JSON Schema — use str, "
                    "int, float, bool, list[...], dict, Literal[...], an Enum, or pass "
                    "tool(..., parameters={...})")


def _json_type(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph, and each parameter's description (Google ``Args:`` entries, with
    their indented continuation lines, or ``:param x:`` lines)."""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or _SECTION.fullmatch(text) or text.startswith(":"):
            break
        summary.append(text)
    params = {m[1]: m[2].strip() for m in _PARAM_LINE.finditer(doc)}
    header = -1  # the indent of the Args: line while inside that section
    entry = None  # the indent of its entries
    current = ""
    for line in lines:
        text = line.strip()
        if not text:
            continue
        indent = len(line) - len(line.lstrip())
        if text in ("Args:", "Arguments:", "Parameters:"):
            header, entry, current = indent, None, ""
            continue
        if header < 0:
            continue
        if indent <= header:
            header = -1
            continue
        if entry is None:
            entry = indent
        m = _ARG_LINE.fullmatch(text)
        if indent == entry and m:
            current = m[1]
            params[current] = m[2].strip()
        elif current:
            params[current] = f"{params[current]} {text}".strip()
    return " ".join(summary), params


# --- arguments against the schema --------------------------------------------------------------
class InvalidArguments(Exception):
    """Arguments the tool's schema does not allow; the text tells the model what to fix."""


def arguments(
    raw: str, parameters: dict[str, Any], fill_none: Iterable[str],
    convert: dict[str, Callable[[Any], Any]],
) -> dict[str, Any]:
    """A call's ``raw`` JSON arguments checked against ``parameters`` (the tool's schema), the
    optional ones ``fill_none`` names set to None when absent, and each converted as
    ``convert`` says; InvalidArguments, saying what to fix, when they do not fit."""
    text = raw.strip() if isinstance(raw, str) else raw
    if text in ("", None):
        args: Any = {}
    else:
        try:
            # strict=False: a raw newline or tab inside a string (small models write them) is
            # that character, not an error to send back
            args = json.loads(text, strict=False)
        except (json.JSONDecodeError, RecursionError, TypeError) as exc:
            raise InvalidArguments(
                f"they are not valid JSON ({exc}); send one JSON object") from None
    if not isinstance(args, dict):
        raise InvalidArguments(f"expected a JSON object of arguments, got {_kind(args)}")
    problem = _check(args, parameters, "")
    if problem:
        raise InvalidArguments(problem)
    for name in fill_none:
        args.setdefault(name, None)
    for name, conv in convert.items():
        if name in args:
            try:
                args[name] = conv(args[name])
            except (TypeError, ValueError) as exc:
                raise InvalidArguments(f"{name}: {exc}") from None
    return args


_EXPECTED = {"string": "a string", "integer": "an integer", "number": "a number",
             "boolean": "true or false", "array": "a list", "object": "an object",
             "null": "null"}


def _check(value: Any, schema: Any, where: str) -> str:
    """What is wrong with ``value`` against ``schema`` ("" when nothing): ``type``, ``enum``,
    ``properties``, ``required``, ``additionalProperties`` and ``items`` are checked; other
    keywords (``minimum``, ``pattern``...) are the tool's to check."""
    if not isinstance(schema, dict):
        return ""
    label = where or "the arguments"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(value, k) for k in kinds):
            want = " or ".join(_EXPECTED.get(k, k) for k in kinds)
            return f"{label}: expected {want}, got {_shown(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{label}: expected one of {json.dumps(schema['enum'])}, got {_shown(value)}"
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        missing = [k for k in schema.get("required") or () if k not in value]
        if missing:
            return "; ".join(
                f"missing {_join(where, k)} ({_expected(props.get(k))})" for k in missing)
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                problem = _check(item, props[key], _join(where, key))
            elif extra is False:
                allowed = ", ".join(props) or "none"
                return f"unknown argument {_join(where, key)!r} (the arguments are: {allowed})"
            else:
                problem = _check(item, extra, _join(where, key))
            if problem:
                return problem
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = _check(item, schema["items"], f"{label}[{i}]")
            if problem:
                return problem
    return ""


def _is(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":  # JSON Schema: 4.0 is an integer
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _expected(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any value"
    if "enum" in schema:
        return f"one of {json.dumps(schema['enum'])}"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or ())
    return " or ".join(_EXPECTED.get(k, k) for k in kinds) or "any value"


def _kind(value: Any) -> str:
    for kind in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _is(value, kind) and not (kind == "integer" and isinstance(value, float)):
            return _EXPECTED[kind]
    return type(value).__name__


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > 40:
        text = text[:40] + "…"
    return f"{text} ({_kind(value)})"
