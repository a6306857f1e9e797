"""Load a plan file: YAML with line numbers in, a validated `Plan` or one clean error line out.

Every problem becomes `<path>:<line>:<col>: <dotted.path[index]>: <message>`, pointing at the offending key (or at the
mapping that lacks a required key). Messages never repeat a value given for a secret, and nothing a user can put in
the file (garbage bytes, a directory, an enormous file, bad YAML) produces a traceback.
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.plan.model import DEFER_CROSS_CHECKS, Plan, SecretRef, cross_field_problems

MAX_PLAN_BYTES = 1024 * 1024
# A real plan has a few hundred values, nested six deep, a few KB of text. Aliases can make a small file expand
# into billions of values: the composer counts every node (an alias counts the whole subtree it stands for) and
# the characters they hold, and stops at these limits before anything is built from them.
MAX_PLAN_VALUES = 10_000  # nodes: mappings, lists, keys and values, aliases expanded
MAX_PLAN_EXPANDED = 2 * 1024 * 1024  # characters of every key and value, aliases expanded
MAX_PLAN_DEPTH = 50  # nesting levels
MAX_KEY_CHARS = 100
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

FieldPath = tuple[str | int, ...]
Position = tuple[int, int]  # 1-based line and column


class PlanError(Exception):
    """A plan that cannot be used. str() is the first problem, one self-contained line; `lines` holds them all."""

    def __init__(self, lines: list[str]) -> None:
        lines = [_one_line(line) for line in lines]
        super().__init__(lines[0])
        self.lines = lines


def _one_line(text: str) -> str:
    # A key or value from the file may hold control characters: show them escaped, keep the line one line.
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


@dataclass(frozen=True)
class LoadedPlan:
    plan: Plan
    path: Path
    text: str
    sha256: str  # of the file's bytes
    positions: dict[FieldPath, Position] = field(default_factory=dict, repr=False, compare=False)

    def line_of(self, field_path: FieldPath) -> int | None:
        """Line of the plan where `field_path` (e.g. ('files', 0, 'target')) is written, if it is written."""
        position = self.positions.get(tuple(field_path))
        return position[0] if position else None


def dotted(field_path: FieldPath) -> str:
    text = ""
    for part in field_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class _TooBig(Exception):
    def __init__(self, what: str, position: Position | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.position = position


class _BoundedComposer(Composer):
    """ruamel's composer, counting what the document would be once every alias is expanded.

    Each node's weight (itself, the characters of a scalar, and its children's weights) is computed once, when it
    is composed; an alias adds the weight of the node it names without copying anything. Both the node count and
    the expanded size are checked as the document is read, so a bomb stops within its first few thousand events.
    """

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self.warn_double_anchors = False  # a reused anchor is legal YAML: no warning on stderr
        self._weights: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, characters), aliases expanded
        self._nodes = 0
        self._characters = 0

    def _weight(self, node: Node) -> tuple[int, int]:
        known = self._weights.get(id(node))
        if known is not None:
            return known
        nodes, characters = 1, 0
        if isinstance(node, ScalarNode):
            characters = len(node.value)
        elif isinstance(node, SequenceNode):
            for child in node.value:
                child_nodes, child_chars = self._weight(child)
                nodes, characters = nodes + child_nodes, characters + child_chars
        elif isinstance(node, MappingNode):
            for key, value in node.value:
                for child in (key, value):
                    child_nodes, child_chars = self._weight(child)
                    nodes, characters = nodes + child_nodes, characters + child_chars
        self._weights[id(node)] = (nodes, characters)
        return nodes, characters

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.parser.check_event(AliasEvent)
        # Blame where the node is written: for an alias, the alias, not the anchor it repeats.
        mark = self.parser.peek_event().start_mark
        node = super().compose_node(parent, index)
        nodes, characters = self._weight(node)
        if alias:  # the subtree counts again wherever it is used
            self._nodes += nodes
            self._characters += characters
        else:  # its children were counted as they were composed
            self._nodes += 1
            self._characters += characters if isinstance(node, ScalarNode) else 0
        where = _position(mark.line, mark.column) if mark is not None else None
        if self._nodes > MAX_PLAN_VALUES or nodes > MAX_PLAN_VALUES:
            raise _TooBig(f"more than {MAX_PLAN_VALUES} values", where)
        if self._characters > MAX_PLAN_EXPANDED or characters > MAX_PLAN_EXPANDED:
            raise _TooBig(f"more than {MAX_PLAN_EXPANDED // 1024 // 1024} MiB of text", where)
        return node


class _BadValue(Exception):
    def __init__(self, position: Position, at: FieldPath, message: str) -> None:
        super().__init__(message)
        self.position = position
        self.message = f"{dotted(at)}: {message}" if at else message


@dataclass
class _Document:
    """The YAML as plain Python values, with the position of every key, list item and mapping."""

    data: Any
    keys: dict[FieldPath, Position] = field(default_factory=dict)  # where a key (or a list item) is written
    containers: dict[FieldPath, Position] = field(default_factory=dict)  # where a mapping or list begins
    count: int = 0


def _position(line: int | None, col: int | None) -> Position:
    return ((line or 0) + 1, (col or 0) + 1)


def _plain(node: Any, at: FieldPath, start: Position, doc: _Document) -> Any:
    """Convert ruamel's round-trip objects to plain values, recording positions on the way."""
    doc.count += 1
    if doc.count > MAX_PLAN_VALUES:
        raise _TooBig(f"more than {MAX_PLAN_VALUES} values")
    if isinstance(node, CommentedMap):
        doc.containers[at] = start
        plain_map: dict[Any, Any] = {}
        for key, value in node.items():
            try:
                line, col = node.lc.key(key)
                key_position = _position(line, col)
            except (KeyError, TypeError, IndexError):  # a key merged in with '<<' has no position of its own
                key_position = start
            if not isinstance(key, str):
                shown = _describe(key) if isinstance(key, str | int | float | bool) or key is None else "a value"
                raise _BadValue(key_position, at, f"keys must be text, got {type(key).__name__} {shown}")
            if len(key) > MAX_KEY_CHARS:
                raise _BadValue(key_position, at, f"a key of {len(key)} characters: not a plan key")
            doc.keys[(*at, key)] = key_position
            plain_map[key] = _plain(value, (*at, key), key_position, doc)
        return plain_map
    if isinstance(node, CommentedSeq):
        doc.containers[at] = start
        plain_list: list[Any] = []
        for index, value in enumerate(node):
            try:
                line, col = node.lc.item(index)
                item_position = _position(line, col)
            except (KeyError, TypeError, IndexError):
                item_position = start
            doc.keys[(*at, index)] = item_position
            plain_list.append(_plain(value, (*at, index), item_position, doc))
        return plain_list
    if isinstance(node, TaggedScalar) or (hasattr(node, "tag") and getattr(node.tag, "value", None)):
        tag = getattr(node.tag, "value", None) or str(node.tag)
        raise _BadValue(start, at, f"unsupported YAML tag {tag!r}")
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, datetime.date):  # `2024-01-01` unquoted: keep the text the user wrote
        return node.isoformat()
    raise _BadValue(start, at, f"unsupported YAML value of type {type(node).__name__}")


def _read(path: Path, kind: str = "plan") -> bytes:
    shown = str(path)
    try:
        if path.is_dir():
            raise PlanError([f"{shown}: cannot read: is a directory"])
        if path.exists() and not path.is_file():  # a FIFO would block forever, a device never ends
            raise PlanError([f"{shown}: cannot read: not a regular file"])
        with path.open("rb") as handle:
            data = handle.read(MAX_PLAN_BYTES + 1)
    except PlanError:
        raise
    except OSError as exc:
        raise PlanError([f"{shown}: cannot read: {exc.strerror or exc.__class__.__name__}"]) from None
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError([f"{shown}: cannot read: larger than {MAX_PLAN_BYTES // 1024} KiB, not a {kind}"])
    return data


def _yaml_error(shown: str, exc: YAMLError, text: str) -> PlanError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, DuplicateKeyError):
        # ruamel's own message repeats both values, which may be secrets: name the key only.
        problem = str(getattr(exc, "problem", "") or "")
        key = problem.split('"')[1] if problem.count('"') >= 2 else "?"
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        return PlanError([f"{shown}{at}: duplicate key '{key}'"])
    if isinstance(exc, MarkedYAMLError) and mark is not None:
        problem = exc.problem or exc.context or "syntax error"
        return PlanError([f"{shown}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}"])
    position = getattr(exc, "position", None)
    reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
    if isinstance(position, int):
        before = text[:position]
        line = before.count("\n") + 1
        col = position - (before.rfind("\n") + 1) + 1
        return PlanError([f"{shown}:{line}:{col}: not valid YAML: {reason}"])
    return PlanError([f"{shown}: not valid YAML: {reason}"])


def _too_big(shown: str, exc: _TooBig, kind: str = "plan") -> PlanError:
    where = f":{exc.position[0]}:{exc.position[1]}" if exc.position else ""
    return PlanError([f"{shown}{where}: the {kind} holds {exc.what} once aliases are expanded: not a {kind}"])


PLAN_KEYS = "name, source, target, ..."


def _parse(shown: str, text: str, keys: str = PLAN_KEYS, kind: str = "plan") -> _Document:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.Composer = _BoundedComposer
    yaml.max_depth = MAX_PLAN_DEPTH
    try:
        root = yaml.load(text)
    except _TooBig as exc:
        raise _too_big(shown, exc, kind) from None
    except MaxDepthExceededError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise PlanError([f"{shown}{where}: not valid YAML: nested more than {MAX_PLAN_DEPTH} levels deep"]) from None
    except YAMLError as exc:
        raise _yaml_error(shown, exc, text) from None
    except RecursionError:
        raise PlanError([f"{shown}: not valid YAML: nested too deeply"]) from None
    except TypeError:  # ruamel cannot hash a list or mapping used as a key ("? [a, b]")
        raise PlanError([f"{shown}: not valid YAML: a key must be plain text, not a list or a mapping"]) from None
    except Exception as exc:  # ruamel raises a few plain errors on pathological input
        raise PlanError([f"{shown}: not valid YAML: {exc.__class__.__name__}"]) from None
    if root is None:
        raise PlanError([f"{shown}:1:1: the {kind} is empty: expected a mapping of keys ({keys})"])
    if not isinstance(root, CommentedMap):
        shape = "a list" if isinstance(root, CommentedSeq) else "a single value"
        raise PlanError([f"{shown}:1:1: the {kind} must be a mapping of keys ({keys}), not {shape}"])
    try:
        line, col = root.lc.line, root.lc.col
    except AttributeError:
        line, col = 0, 0
    doc = _Document(data=None)
    try:
        doc.data = _plain(root, (), _position(line, col), doc)
    except _TooBig as exc:
        raise _too_big(shown, exc, kind) from None
    except RecursionError:
        raise PlanError([f"{shown}: not valid YAML: nested too deeply"]) from None
    except _BadValue as exc:
        raise PlanError([f"{shown}:{exc.position[0]}:{exc.position[1]}: {exc.message}"]) from None
    return doc


# --- mapping pydantic's error locations to the plan's fields ---------------------------------------------------------


def _strip_optional(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if origin in (Union, types.UnionType):
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return []


def _tag_of(model: Any) -> str | None:
    if isinstance(model, type) and issubclass(model, BaseModel) and "kind" in model.model_fields:
        kind = model.model_fields["kind"].annotation
        if typing.get_origin(kind) is Literal:
            return str(typing.get_args(kind)[0])
    return None


@dataclass
class _Located:
    field_path: FieldPath  # the path in the plan (union tags removed)
    model: type[BaseModel] | None  # the model whose field the last element names
    secret: bool  # the location is, or is inside, a secret


def _locate(loc: tuple[Any, ...], root: type[BaseModel] = Plan) -> _Located:
    """Walk pydantic's `loc` along the model's types: drop union tags, note secrets and the enclosing model."""
    annotation: Any = root
    field_path: list[str | int] = []
    model: type[BaseModel] | None = None
    secret = False
    for part in loc:
        annotation = _strip_optional(annotation)
        members = _union_members(annotation)
        if members and isinstance(part, str):
            chosen = [member for member in members if _tag_of(member) == part]
            if chosen:  # a discriminated union's tag: not part of the plan's path
                annotation = chosen[0]
                continue
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            field_path.append(part)
            info = annotation.model_fields.get(str(part))
            annotation = info.annotation if info is not None else Any
            if annotation is not Any and _mentions(annotation, SecretRef):
                secret = True
            continue
        if typing.get_origin(annotation) is list and isinstance(part, int):
            field_path.append(part)
            annotation = typing.get_args(annotation)[0]
            model = None
            continue
        field_path.append(part)
        annotation = Any
        model = None
    return _Located(tuple(field_path), model, secret or _mentions(annotation, SecretRef))


def _mentions(annotation: Any, wanted: type) -> bool:
    if annotation is wanted:
        return True
    return any(_mentions(arg, wanted) for arg in typing.get_args(annotation))


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return repr(shown)
    return str(value)


def _bound(value: Any) -> str:
    # pydantic reports a float field's bound as a float: say 3600, not 3600.0.
    return f"{value:g}" if isinstance(value, float) else str(value)


def _message(error: Any, located: _Located) -> str:
    kind = error["type"]
    context = error.get("ctx") or {}
    value = error.get("input")
    # Inside a secret nothing the user wrote is ever repeated.
    got = "" if located.secret else f", got {_describe(value)}"
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        name = str(located.field_path[-1]) if located.field_path else "?"
        fields = list(located.model.model_fields) if located.model is not None else []
        close = difflib.get_close_matches(name, fields, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"unknown key '{name}'{hint}"
    if kind in ("string_type", "string_unicode"):
        quote = " (put it in quotes)" if isinstance(value, int | float) and not located.secret else ""
        return f"expected text{got}{quote}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected a whole number{got}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number{got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false{got}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list{got}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping (key: value){got}"
    if kind == "finite_number":
        return f"must be a finite number{got}"
    if kind == "string_too_long":
        return f"too long: at most {context.get('max_length')} characters"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "literal_error":
        return f"must be {context.get('expected', 'one of the allowed values')}{got}"
    if kind == "greater_than":
        return f"must be greater than {_bound(context.get('gt'))}{got}"
    if kind == "greater_than_equal":
        return f"must be at least {_bound(context.get('ge'))}{got}"
    if kind == "less_than":
        return f"must be less than {_bound(context.get('lt'))}{got}"
    if kind == "less_than_equal":
        return f"must be at most {_bound(context.get('le'))}{got}"
    if kind == "too_short":
        return f"must have at least {context.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {context.get('max_length')} item(s)"
    if kind == "string_pattern_mismatch":
        if located.field_path == ("name",):
            return "must start with a letter or digit and hold only letters, digits, '.', '_' and '-'"
        return f"must match the pattern {context.get('pattern')}"
    if kind == "union_tag_invalid":
        return f"unknown kind {context.get('tag')!r}: must be {context.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return f"missing '{context.get('discriminator', 'kind').strip(chr(39))}' (what kind of check this is)"
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message


def _where(doc: _Document, field_path: FieldPath, kind: str) -> Position:
    """The key to blame; for a missing key the mapping that lacks it; else the nearest enclosing thing written."""
    path = field_path[:-1] if kind == "missing" else field_path
    for cut in range(len(path), -1, -1):
        prefix = path[:cut]
        if prefix in doc.keys:
            return doc.keys[prefix]
        if prefix in doc.containers:
            return doc.containers[prefix]
    return (1, 1)


# Within one mapping, an unknown key is reported before a missing one: the typo usually explains the absence.
_RANK = {"extra_forbidden": 0, "missing": 2}


def _located_lines(
    shown: str, doc: _Document, exc: ValidationError, root: type[BaseModel] = Plan
) -> Iterator[tuple[Any, str]]:
    for error in exc.errors(include_url=False):
        located = _locate(tuple(error["loc"]), root)
        field_path = located.field_path
        if error["type"] == "union_tag_invalid" and (*field_path, "kind") in doc.keys:
            field_path = (*field_path, "kind")
            located = _Located(field_path, located.model, located.secret)
        line, col = _where(doc, field_path, error["type"])
        mapping = _where(doc, field_path, "missing")
        prefix = f"{dotted(field_path)}: " if field_path else ""
        # An unknown key sorts at its mapping's start, so it comes before the "field required" it explains.
        first = mapping if error["type"] == "extra_forbidden" else (line, col)
        order = (first, _RANK.get(error["type"], 1), (line, col))
        yield order, f"{shown}:{line}:{col}: {prefix}{_message(error, located)}"


def _validate(shown: str, doc: _Document) -> Plan:
    try:
        plan = Plan.model_validate(doc.data, context={DEFER_CROSS_CHECKS: True})
    except ValidationError as exc:
        located = sorted(_located_lines(shown, doc, exc), key=lambda item: item[0])
        raise PlanError([line for _, line in located]) from None
    problems = cross_field_problems(plan)
    if problems:
        lines = []
        for where, message in problems:
            line, col = _where(doc, where, "value_error")
            lines.append(((line, col), f"{shown}:{line}:{col}: {dotted(where)}: {message}"))
        lines.sort(key=lambda item: item[0])
        raise PlanError([text for _, text in lines])
    return plan


def parse_plan(text: str, shown: str = "<plan>") -> tuple[Plan, dict[FieldPath, Position]]:
    """Validate plan text; `shown` names it in error lines. Returns the plan and where each key is written."""
    doc = _parse(shown, text)
    return _validate(shown, doc), doc.keys


Model = TypeVar("Model", bound=BaseModel)


def load_model(
    path: Path, root: type[Model], keys: str, kind: str = "plan"
) -> tuple[Model, str, dict[FieldPath, Position]]:
    """Another YAML file validated like a plan (a fleet file): the same limits, the same file:line:col lines.

    `keys` names the top-level keys an empty file should have held. Cross-field checks are the caller's (they
    name a field path; `position_of` turns it into file:line:col)."""
    path = Path(path)
    shown = str(path)
    text = _text_of(shown, _read(path, kind))
    doc = _parse(shown, text, keys, kind)
    try:
        model = root.model_validate(doc.data)
    except ValidationError as exc:
        located = sorted(_located_lines(shown, doc, exc, root), key=lambda item: item[0])
        raise PlanError([line for _, line in located]) from None
    return model, text, doc.keys


def position_of(positions: dict[FieldPath, Position], field_path: FieldPath) -> Position:
    """Where `field_path` (or the nearest enclosing key) is written: for a caller's cross-field problems."""
    for cut in range(len(field_path), -1, -1):
        if field_path[:cut] in positions:
            return positions[field_path[:cut]]
    return (1, 1)


def _text_of(shown: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        raise PlanError([f"{shown}:{line}:{col}: not valid YAML: not UTF-8 text"]) from None
    return text[1:] if text.startswith("\ufeff") else text  # a byte order mark some editors add


def load_plan(path: Path) -> LoadedPlan:
    """Read, parse and validate a plan file; raises PlanError whose str() is the one line to print."""
    path = Path(path)
    shown = str(path)
    data = _read(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        raise PlanError([f"{shown}:{line}:{col}: not valid YAML: not UTF-8 text"]) from None
    if text.startswith("\ufeff"):  # a byte order mark some editors add
        text = text[1:]
    plan, positions = parse_plan(text, shown)
    return LoadedPlan(plan=plan, path=path, text=text, sha256=hashlib.sha256(data).hexdigest(), positions=positions)


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of a plan file, for editors (e.g. yaml-language-server's `# yaml-language-server: $schema`)."""
    schema = Plan.model_json_schema(mode="validation")
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "migrate plan",
        **{key: value for key, value in schema.items() if key != "title"},
    }
