"""JAX pytrees for ``all_reduce_tree``: custom nodes (registered dataclasses, flax and
equinox modules) flattened by ``jax.tree_util``, and results handed back as JAX arrays
where JAX arrays were given.

JAX is never imported here: a tree can only hold JAX values once the program has
imported it, so ``sys.modules`` says whether to look.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["flatten", "is_jax_array", "to_jax"]


def _jax() -> Optional[Any]:
    return sys.modules.get("jax")


def is_jax_array(x: Any) -> bool:
    """True for a ``jax.Array`` (False, cheaply, when JAX was never imported)."""
    jax = _jax()
    return jax is not None and isinstance(x, jax.Array)


def flatten(tree: Any) -> Optional[Tuple[List[Tuple[str, Any]], Callable[[List[Any]], Any]]]:
    """(path, leaf) pairs of any pytree in ``jax.tree_util``'s order, with the function
    that rebuilds the tree from new leaves; None when JAX was never imported. Paths read
    as ``jax.tree_util.keystr`` writes them: ``"['dense']['w']"``, ``".w"``, ``"[0]"``."""
    jax = _jax()
    if jax is None:
        return None
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [(jax.tree_util.keystr(path), leaf) for path, leaf in pairs]
    return leaves, treedef.unflatten


def to_jax(result: Any, given: Any) -> Any:
    """``result`` (a numpy array) as a JAX array on ``given``'s device(s) when ``given``
    is a JAX array, else ``result`` itself."""
    if not is_jax_array(given):
        return result
    jax = _jax()
    sharding = getattr(given, "sharding", None)
    return jax.device_put(result, sharding) if sharding is not None else jax.numpy.asarray(result)
