"""Where an op of a Gluon model sits: the paths of a block tree (``2``,
``encoder.layers.3``: the child names of ``Block._children`` from the root, the same in every
build and process) and the block names (``dense2``: Gluon's process-wide counter) a graph
node or an op call is covered by. What a policy's layer rules match (``Policy.layers``), in
``init``'s op calls, the converted graphs, the cast report and the doctor. Pure walks of the
tree; no host sync."""
from __future__ import annotations

from typing import Any, Optional

from amp_adapters.rules.layers import layer_paths, stems_of


def tree_paths(root: Any) -> dict[int, str]:
    """{id(block): its path from ``root``}: the child names of ``Block._children`` joined by
    ``.`` (``2`` for a HybridSequential's third child, ``encoder.layers.3``); ``root`` is
    ``""`` (``amp_adapters.rules.layers.layer_paths``)."""
    return layer_paths(root, lambda b: b._children.items())



def block_names(*blocks: Any) -> tuple[str, ...]:
    """The names of ``blocks`` and every block under them, sorted (the old form of the
    names the policy's layer rules match an op call by: ``_named_call``)."""
    out, todo = set(), list(blocks)
    while todo:
        b = todo.pop()
        if b.name:
            out.add(b.name)
        todo.extend(b._children.values())
    return tuple(sorted(out))


def block_layers(*roots: Any, paths: Optional[dict[int, str]] = None) -> dict[str, str]:
    """{block name: its path} of every block under each of ``roots`` (a root's path is
    ``""``; ``paths``: {id(block): path} of an enclosing tree instead, as a block called
    inside its model has them): how a node of a traced graph, named after its block's
    prefix, finds its path (``node_instance``)."""
    out: dict[str, str] = {}
    for root in roots:
        where = tree_paths(root) if paths is None else paths
        todo = [root]
        while todo:
            b = todo.pop()
            if b.name and b.name not in out:
                out[b.name] = where.get(id(b), "")
            todo.extend(b._children.values())
    return out


def _covering(node: str, layers: dict[str, str]) -> list[str]:
    """The block names of ``layers`` that cover node ``node`` (``dense2`` for ``dense2_fwd``),
    innermost (longest) first."""
    return [b for b in reversed(stems_of(node)) if b in layers]


def node_instance(node: str, layers: dict[str, str]) -> tuple[str, ...]:
    """The instance names of graph node ``node`` for the policy's layer rules, as a traced call
    has them (``_named_call``): its own name, then each block covering it, innermost first,
    by name and by path (``layers``: ``block_layers``)."""
    out = [node]
    for b in _covering(node, layers):
        out += [b, layers[b]] if layers[b] else [b]
    return tuple(out)


def layer_of(node: str, layers: dict[str, str]) -> str:
    """The layer the doctor's fix names graph node ``node`` by: the path of the innermost
    block covering it (``2`` for ``dense2_fwd``: the same in every build of the model); a
    node of the root block itself has no path, and keeps the innermost block's name, else
    its own."""
    covering = _covering(node, layers)
    for b in covering:
        if layers[b]:
            return layers[b]
    return covering[0] if covering else node
