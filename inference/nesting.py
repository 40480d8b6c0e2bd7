"""A bound on the nesting depth of parsed JSON values.

Python's parser accepts about 1,000 levels and pydantic's serializer about 255, so a value nested
a few hundred levels deep used to be accepted at one place and fail at another with a 500
("Maximum serialization depth exceeded"). Request bodies, inference replies and the tool-call
arguments inside them are held to `MAX_JSON_DEPTH` where they enter.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64


_CONTAINERS = (dict, list)  # a tuple: isinstance with it is faster than with ``dict | list``


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests more than ``limit`` objects/arrays deep."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        deeper = []
        for node in level:
            for child in node.values() if isinstance(node, dict) else node:
                if isinstance(child, _CONTAINERS):
                    deeper.append(child)
        level = deeper
    return False
