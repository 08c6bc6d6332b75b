"""YAML and JSON text -> Python data, with bounds an untrusted file cannot get around.

- Duplicate mapping keys are an error (YAML 1.2 requires unique keys; PyYAML silently keeps
  the last one). Merge keys (``<<: *anchor``) may be overridden, as YAML's merge spec says.
- Aliases are counted before anything is built: a document whose nodes, with every alias
  expanded, exceed :data:`MAX_EXPANDED_NODES` (the "billion laughs" attack) or that refers to
  itself is refused. The count walks the composed node graph once per distinct node, so a
  663-byte bomb is refused in microseconds and a few kilobytes of memory.
- Nesting deeper than :data:`MAX_DEPTH` is refused (YAML and JSON), so no parser recursion
  error escapes.
- JSON's non-standard ``NaN`` / ``Infinity`` are read as floats here; the converters that read
  a number check that it is finite and name the key.

Every error is a :class:`~simdist.errors.ScenarioError` with one problem whose message is one
line: ``<source>:<line>:<column>: <what>``.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from simdist.errors import Problem, ScenarioError

MAX_EXPANDED_NODES = 100_000  # a scenario has a few hundred; the largest catalog a few thousand
MAX_DEPTH = 64  # a scenario nests 4 levels; Hugging Face configs about 5

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc,valid-type]
    """Safe loader that refuses duplicate keys (the mark of the second one is reported)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: PyYAML's own check reports it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _where(source: str, mark: Any) -> str:
    if mark is None:
        return source
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _yaml_problem(field: str, source: str, exc: yaml.YAMLError) -> Problem:
    """One line: where, what, and the context PyYAML gives (e.g. "while parsing a mapping")."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem is None and isinstance(exc, yaml.reader.ReaderError):
        return Problem(field, f"{source}: {_one_line(str(exc))}")
    context = getattr(exc, "context", None)
    what = _one_line(problem or str(exc))
    if context:
        what += f" ({_one_line(context)})"
    return Problem(field, f"{_where(source, mark)}: {what} (not valid YAML)")


def _check_graph(root: yaml.Node, source: str, field: str) -> None:
    """Refuse alias bombs, self-references and deep nesting before anything is constructed."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # iterative post-order walk: (node, depth, children visited?)
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            total = 1 + sum(sizes[id(ch)] for ch in children)
            sizes[key] = total
            if total > MAX_EXPANDED_NODES:
                raise ScenarioError(Problem(field, f"{_where(source, node.start_mark)}: with its aliases "
                                            f"expanded the document has more than {MAX_EXPANDED_NODES:,} "
                                            "values (an alias bomb?)"))
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ScenarioError(Problem(field, f"{_where(source, node.start_mark)}: an alias refers to "
                                        "a node that contains it"))
        if depth > MAX_DEPTH:
            raise ScenarioError(Problem(field, f"{_where(source, node.start_mark)}: nested more than "
                                        f"{MAX_DEPTH} levels deep"))
        on_path.add(key)
        stack.append((node, depth, True))
        for child in _children(node):
            if id(child) not in sizes:
                stack.append((child, depth + 1, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_nesting(text: str, source: str, field: str) -> None:
    """Nesting depth from the parser's event stream (libyaml parses without recursion; the
    composer that builds nodes recurses in C and would crash on 100,000 levels)."""
    events = _Base(text)
    try:
        depth = 0
        while events.check_event():
            event = events.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ScenarioError(Problem(field, f"{_where(source, event.start_mark)}: nested more "
                                                f"than {MAX_DEPTH} levels deep"))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        events.dispose()


def parse_yaml(text: str, source: str, field: str = "file", bounded: bool = True) -> Any:
    """The data of one YAML document (``None`` for an empty one). ``bounded=False`` skips the
    nesting and alias bounds (a second parse and a walk of the nodes), for the package's own
    data files only (simdist.catalog): never for a file a user gives."""
    loader = _Loader(text)
    try:
        if bounded:
            _check_nesting(text, source, field)
        node = loader.get_single_node()
        if node is None:
            return None
        if bounded:
            _check_graph(node, source, field)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ScenarioError(_yaml_problem(field, source, exc)) from None
    except RecursionError:
        raise ScenarioError(Problem(field, f"{source}: nested too deeply")) from None
    except ScenarioError:  # already one line naming the place (a ValueError too: not wrapped again)
        raise
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ScenarioError(Problem(field, f"{source}: {_one_line(str(exc))[:200]}")) from None
    finally:
        loader.dispose()


def parse_json(text: str, source: str, field: str) -> Any:
    """The data of a JSON text; a syntax error names line and column."""
    depth = _json_depth(text)
    if depth > MAX_DEPTH:
        raise ScenarioError(Problem(field, f"{source}: nested more than {MAX_DEPTH} levels deep"))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(Problem(field, f"{source}:{exc.lineno}:{exc.colno}: {exc.msg} "
                                    "(not valid JSON)")) from None
    except RecursionError:  # not reached after the depth check; kept as a last line of defence
        raise ScenarioError(Problem(field, f"{source}: nested too deeply")) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ScenarioError(Problem(field, f"{source}: {_one_line(str(exc))[:200]}")) from None


def _json_depth(text: str) -> int:
    """Deepest bracket nesting outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
