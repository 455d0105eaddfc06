"""YAML read safely: the loader of config files and overrides (``config`` reads through it).

PyYAML's safe loader, with YAML 1.2's floats (``1e-3``) and integers (``010`` is ten), a key given
twice refused, and a
document measured before it is built: aliases that would expand past ``YAML_MAX_VALUES``
values (a "billion laughs"), an alias inside the structure it names, or nesting deeper than
``YAML_MAX_DEPTH`` is a ``YAMLBoundError`` naming the line, never a MemoryError or a
RecursionError.
"""

from __future__ import annotations

import re

import yaml


class YAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but reading ``1e-3`` as a float like YAML 1.2 (PyYAML wants ``1.0e-3``)
    and refusing a key given twice in one mapping (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


YAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)

INT = "tag:yaml.org,2002:int"
for _first, _resolvers in YAMLLoader.yaml_implicit_resolvers.items():  # YAML 1.1's ints out (010 is 8 there)
    _resolvers[:] = [(tag, regexp) for tag, regexp in _resolvers if tag != INT]
YAMLLoader.add_implicit_resolver(
    INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|[-+]?0o[0-7_]+|[-+]?0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)


def construct_int(loader, node) -> int:
    """YAML 1.2's integers: decimal even with leading zeros (``010`` is 10), ``0o17`` octal, ``0x1f``
    hexadecimal (YAML 1.1 reads ``010`` as 8 and ``1:20`` as 80); ``_`` between digits is allowed."""
    text = loader.construct_scalar(node).replace("_", "")
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    base = {"0o": 8, "0x": 16}.get(digits[:2], 10)
    return sign * int(digits[2:] if base != 10 else digits, base)


YAMLLoader.add_constructor(INT, construct_int)


class YAMLBoundError(yaml.composer.ComposerError):
    """A YAML document refused before it is built: an alias bomb, a recursive alias, deep nesting."""


YAML_MAX_VALUES = 100_000  # values a document may hold once its aliases are expanded
YAML_MAX_DEPTH = 100  # sections nested in sections


def parse_yaml(text):
    """YAML text (or a stream) as Python values. The document is composed first and measured
    before anything is built: aliases that would expand past ``YAML_MAX_VALUES`` values (a
    "billion laughs"), a structure that holds itself, or nesting deeper than
    ``YAML_MAX_DEPTH`` is a ``yaml.YAMLError`` naming the line, never a MemoryError or a
    RecursionError."""
    loader = YAMLLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLBoundError(None, None, f"nested deeper than {YAML_MAX_DEPTH} levels", None) from None
        if node is None:
            return None
        expanded_size(node, {}, ())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def expanded_size(node, sizes: dict, within: tuple) -> int:
    """How many values ``node`` stands for with every alias expanded (``sizes`` memoises shared
    nodes, so a bomb is measured without being expanded); refuses a node inside itself."""
    if id(node) in sizes:
        return sizes[id(node)]
    if any(node is outer for outer in within):
        raise YAMLBoundError(
            None,
            None,
            "an alias refers to a structure that holds it (a recursive alias), which has no finite value",
            node.start_mark,
        )
    if len(within) >= YAML_MAX_DEPTH:
        raise YAMLBoundError(None, None, f"nested deeper than {YAML_MAX_DEPTH} levels", node.start_mark)
    size = 1
    if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        for child in children:
            size += expanded_size(child, sizes, within + (node,))
            if size > YAML_MAX_VALUES:
                raise YAMLBoundError(
                    None,
                    None,
                    f"its aliases expand to more than {YAML_MAX_VALUES:,} values (an alias bomb?)",
                    node.start_mark,
                )
    sizes[id(node)] = size
    return size


def yaml_problem(exc: yaml.YAMLError) -> str:
    """'line L, column C: what is wrong' of a YAML error, on one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"
