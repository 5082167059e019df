"""Gradient trees (dicts, lists and tuples nesting arrays, as JAX and hand-written models
return them): walking their leaves in a fixed order and rebuilding them. Trees with
other nodes (registered dataclasses, flax and equinox modules) are walked by
``jax.tree_util`` (`_tree_jax`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._arrays.buffer import describe, is_torch_tensor
from .._arrays.kinds import kind_of
from .tree_jax import flatten, to_jax

__all__ = [
    "Tree",
    "leaves_and_rebuild",
    "reduce_tree",
    "tree_leaves",
    "tree_rebuild",
    "writable_leaves",
]

Tree = Any
"""A gradient tree: dicts, lists and tuples (namedtuples too) nesting arrays."""


def tree_leaves(tree: Tree, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a tree, depth first, dict keys in insertion order."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from tree_leaves(value, f"{path}[{key!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from tree_leaves(value, f"{path}[{i}]")
    elif tree is not None:
        yield path, tree


def tree_rebuild(tree: Tree, leaves: Iterator[Any]) -> Tree:
    """The tree with its leaves replaced, in `tree_leaves` order, from ``leaves``."""
    if isinstance(tree, dict):
        items = [(key, tree_rebuild(value, leaves)) for key, value in tree.items()]
        # Other dict subclasses (defaultdict) do not take items in their constructor.
        return OrderedDict(items) if isinstance(tree, OrderedDict) else dict(items)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*[tree_rebuild(v, leaves) for v in tree])
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_rebuild(v, leaves) for v in tree)
    if tree is None:
        return None
    return next(leaves)


def _is_array(x: Any) -> bool:
    """Whether a leaf our own walk found is an array (rather than a node it does not know)."""
    return (
        isinstance(x, np.ndarray)
        or is_torch_tensor(x)
        or any(hasattr(x, a) for a in ("__dlpack__", "__cuda_array_interface__", "__array__"))
    )


def leaves_and_rebuild(tree: Tree) -> tuple[list[tuple[str, Any]], Any]:
    """(path, leaf) pairs of a tree and a function rebuilding it from new leaves.

    Dicts, lists and tuples of arrays are walked here (dict keys in insertion order);
    a tree with any other node goes to ``jax.tree_util`` when JAX is loaded, so that
    registered dataclasses, flax and equinox modules flatten as JAX flattens them."""
    leaves = list(tree_leaves(tree))
    if all(_is_array(leaf) for _, leaf in leaves):
        return leaves, lambda new: tree_rebuild(tree, iter(new))
    walked = flatten(tree)
    if walked is None:
        return leaves, lambda new: tree_rebuild(tree, iter(new))  # describe() says what
    return walked


def writable_leaves(
    leaves: list[tuple[str, Any]],
) -> tuple[list[Any], list[Any]]:
    """The leaves of a tree as a bucketer takes them: the arrays to hand over, into
    which the results are written (a numpy view of each host leaf, the leaf itself on a
    GPU, a copy of each read-only leaf); and the leaves to return (the caller's own
    objects, or those copies)."""
    arrays: list[Any] = []
    results: list[Any] = []
    for _, leaf in leaves:
        buf = describe(leaf, "grad")
        arr: Any = leaf if buf.host is None else buf.host
        if buf.readonly:
            kind = kind_of(leaf)
            if buf.host is not None:
                arr = np.array(buf.host, copy=True)
            elif kind is not None:
                arr = kind.copy(leaf)
            else:
                raise TypeError(f"a read-only {type(leaf).__name__} leaf cannot be copied")
            results.append(arr)
        else:
            results.append(leaf)
        arrays.append(arr)
    return arrays, results


def reduce_tree(bucketer: Any, tree: Tree, registered: int | None, *, in_no_sync: bool) -> Tree:
    """GradientBucketer.all_reduce_tree: registers the leaves by path on first use
    (``registered`` None), else checks their number against ``registered``; hands them to
    ready() last first, waits, and returns the tree rebuilt around the results (JAX
    arrays where JAX arrays were given)."""
    leaves, rebuild = leaves_and_rebuild(tree)
    arrays, results = writable_leaves(leaves)
    if registered is None:
        for (path, _), arr in zip(leaves, arrays):
            buf = describe(arr, "grad")
            bucketer.register(path or "<root>", buf.shape, buf.dtype)
    elif len(leaves) != registered:
        raise ValueError(
            f"tree has {len(leaves)} leaves but {registered} parameters are registered"
        )
    for index in reversed(range(len(arrays))):
        bucketer.ready(index, arrays[index])
    bucketer.wait()
    if in_no_sync:
        return tree
    return rebuild([to_jax(r, leaf) for r, (_, leaf) in zip(results, leaves)])


class TreeReduction:
    """GradientBucketer's `all_reduce_tree` (bucketer.py), over its `ready` and `wait`."""

    def all_reduce_tree(self, tree: Tree) -> Tree:
        """Reduces a whole tree of gradients in buckets: dicts, lists and tuples of
        arrays, or any JAX pytree (registered dataclasses, flax and equinox modules,
        flattened by ``jax.tree_util`` when the tree has such nodes).

        For gradients that arrive all at once (e.g. ``jax.grad`` output): the first call
        registers each leaf under its path (``"['dense']['w']"``, ``"[0].w"``) unless
        parameters were registered already, in which case the leaves, in depth-first order,
        must match the registrations. Leaves go to `ready` last first, then `wait` runs.

        Returns a tree of the same structure. A writable leaf (numpy array, torch tensor)
        is reduced in place and returned as the same object; a JAX array (read-only) is
        replaced by a new JAX array of its dtype holding the result. None leaves stay
        None. Inside `no_sync` the leaves are accumulated and the tree is returned
        unchanged.
        """
        if self._ready_count and not self._no_sync_depth:
            raise RuntimeError("all_reduce_tree() in the middle of a step: call wait() first")
        registered = len(self._specs) if self._specs or self._buckets is not None else None
        return reduce_tree(self, tree, registered, in_no_sync=bool(self._no_sync_depth))
