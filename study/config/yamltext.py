"""The one YAML parser for specs, configs, overrides and saved specs, with limits on what a text may cost.

A spec is small: a 50 MB file, a 650-byte alias bomb or 5,000 levels of nesting is a mistake or an attack, and
would otherwise take minutes and gigabytes before any check ran. So: at most MAX_BYTES of UTF-8 text, at most
MAX_ALIASES alias uses, at most MAX_DEPTH levels, no key twice in one mapping (YAML would keep the last silently).
Every refusal is a ConfigError naming the source; messages quote at most MAX_QUOTE characters of any value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from study.errors import ConfigError

MAX_BYTES = 1 << 20
MAX_ALIASES = 100
MAX_NODES = 100_000  # values in the document once every alias is expanded (json, pydantic and copies expand them)
MAX_DEPTH = 64
MAX_QUOTE = 200


def quote(value: Any) -> str:
    """repr(value), cut to MAX_QUOTE characters: an error message never prints a value's whole size."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + f"... ({len(text):,} characters)"


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = 0
        self.depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise ConfigError(f"more than {MAX_ALIASES} YAML aliases (*name): a spec needs none of that size")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ConfigError(f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key {quote(key)} appears twice in one "
                                  "mapping; give each key once")
            seen.add(key)
        return super().construct_mapping(node, deep)


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _BoundedLoader.construct_mapping)


def expanded_size(node: yaml.Node, memo: dict[int, int] | None = None) -> int:
    """How many values `node` stands for with every alias expanded (an alias is the node it names, shared in the
    graph: counted once per use, computed once per node)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = min(size, MAX_NODES + 1)
    return memo[id(node)]


def parse(text: str, source: str) -> Any:
    """YAML text -> Python data, within the limits above; ConfigError naming `source` otherwise."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    if size > MAX_BYTES:
        raise ConfigError(f"{source}: {size:,} bytes; a spec or config is at most {MAX_BYTES:,} bytes")
    try:
        loader = _BoundedLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and expanded_size(node) > MAX_NODES:
                raise ConfigError(f"expands to more than {MAX_NODES:,} values once its aliases (*name) are expanded")
            return loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(e).split())[:MAX_QUOTE * 2]}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None


def read(path: str | Path) -> Any:
    """A YAML file's data: a regular file of at most MAX_BYTES of UTF-8, within the limits above."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give a YAML file")
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes; a spec or config is at most {MAX_BYTES:,} bytes")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        hint = " (it looks like UTF-16: save it as UTF-8)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}){hint}") from None
    return parse(text, str(path))
