"""attrs validators and key classes that several plugins' light keys modules share.

A keys module is imported before torch (:func:`flashspec_core.config.check_components`), so
this module, like :mod:`flashspec_core.config`, imports neither torch nor any plugin. Each
validator has attrs' signature ``(instance, attribute, value)`` and raises ``ValueError``
naming the key, which the config check prefixes with the file and table.
"""

from __future__ import annotations

from typing import Any

import attrs

from flashspec_core.config import TREE_CHILDREN, check_device


def device(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    """A model's ``device`` key: one this machine has, or ``"auto"`` (:func:`check_device`)."""
    check_device(value)


def tree_width(_inst: object, attr: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    """A draft's ``tree_width``: children per node at each depth, each at least 1."""
    if not all(isinstance(w, int) and w >= 1 for w in value):
        raise ValueError(f"{attr.name} must be a list of integers >= 1 (children per node, per level), got {list(value)}")


def tree_children(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    """A draft's ``tree_children``: how a sampling step picks a node's children (:data:`TREE_CHILDREN`)."""
    if value not in TREE_CHILDREN:
        raise ValueError(f"{attr.name} must be one of {', '.join(map(repr, TREE_CHILDREN))}, got {value!r}")


# A dynamic tree's tree_depth (levels) and tree_expand (nodes expanded per level); 0: none.
tree_size = attrs.validators.and_(attrs.validators.instance_of(int), attrs.validators.ge(0))


def check_tree(width: tuple[int, ...], children: str, depth: int, expand: int) -> None:
    """A draft's tree keys together: a static tree (``tree_width``), a dynamic one (``tree_depth``
    and ``tree_expand``, both set) or a chain (none), and a dynamic tree only of top-k children.

    :raises ValueError: naming the keys that clash.
    """
    if (depth > 0) != (expand > 0):
        raise ValueError(f"tree_depth ({depth}) and tree_expand ({expand}) go together: "
                         "set both for a dynamic tree, neither for a chain or a tree_width tree")
    if depth and width:
        raise ValueError("tree_width (a static tree) and tree_depth / tree_expand (a dynamic tree) exclude each other")
    if depth and children != "topk":
        raise ValueError("a dynamic tree keeps the draft's top tokens (tree_children = 'topk'): keeping drawn "
                         "children by their own probabilities would change the law they were drawn from")


def depth(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    """A self-speculative draft's ``layers``: an integer >= 1; ``True`` is refused, though an int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attr.name} must be an integer >= 1 (how many of the target's first layers draft), "
                         f"got {value!r}")


@attrs.frozen
class SelfOptions:
    """Keys of a self-speculative draft, one that runs its target's first layers on the target's
    weights and KV cache: ``layers``, the depth that drafts (1 .. the target's layers). Whether
    the target has that many is known only once it is built."""

    layers: int = attrs.field(validator=depth)
