"""Error feedback as library state: what each quantization dropped, kept per key and
added to the next call's input, so that nothing a codec drops is lost for good.

A compressed all_reduce quantizes twice (see ``_comm/compressed/route.py``): each rank's
contribution to every other rank's chunk (the *worker* error, at those positions), and
the owner's sum of its chunk before the all-gather (the *server* error, in sum units,
kept by the owner at its chunk's positions). Both go to the residual of the rank that
made them; the next call sends ``x + residual`` and so puts each back into the sum once.
Over K calls of the same input the errors telescope: the average of the results differs
from the exact sum by (the last residuals) / K.

Residuals are keyed by name, not by position in a bucket, so a bucketing layer that
regroups its parameters keeps each parameter's residual (``ef.key(param_name)``).

A key's residual lives where its calls run: a numpy array for host arrays, an array of
the input's own library on its GPU for device arrays (`residual_like`); it moves when
a key's calls move, and `state_dict` always holds numpy copies.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import numpy as np

from .._arrays.kinds import kind_of

__all__ = ["ErrorFeedback"]

_VERSION = 1
_SEP = "/"


class ErrorFeedback:
    """Residuals of compressed collectives, by key. Pass one as ``error_feedback=`` to
    ``comm.all_reduce(x, compression=...)`` (or ``reduce_scatter``); each key holds one
    float32 array as long as the arrays reduced under it.

    ``ef.key(name)`` is a view that shares this object's storage under ``name`` (views of
    views join their names with "/"); ``state_dict()`` / ``load_state_dict()`` save and
    restore every residual of this view's subtree (a checkpoint).
    """

    def __init__(self) -> None:
        self._store: Dict[str, np.ndarray] = {}
        self._prefix = ""

    @classmethod
    def _view(cls, store: Dict[str, np.ndarray], prefix: str) -> ErrorFeedback:
        view = cls.__new__(cls)
        view._store = store
        view._prefix = prefix
        return view

    @property
    def name(self) -> str:
        """This view's key ("" for the object made by ``ErrorFeedback()``)."""
        return self._prefix

    def key(self, name: str) -> ErrorFeedback:
        """The view of this one's storage under ``name`` (joined to this view's own key
        with "/"): its residual is kept apart from every other key's."""
        name = str(name)
        if not name:
            raise ValueError("ErrorFeedback.key: the name must not be empty")
        return self._view(self._store, f"{self._prefix}{_SEP}{name}" if self._prefix else name)

    def residual(self, n: int) -> np.ndarray:
        """This key's residual: float32, length n, zeros on first use. It is the stored
        array itself, so the collective (or a caller) updates it in place. ValueError
        when the key's residual has another length (a different array under one key)."""
        stored = self._store.get(self._prefix)
        if stored is None:
            stored = self._store[self._prefix] = np.zeros(int(n), np.float32)
        self._check_size(stored, n)
        if not isinstance(stored, np.ndarray):  # on a device until now: moved here
            stored = self._store[self._prefix] = _host(stored)
        return stored

    def residual_like(self, like: Any, n: int) -> Any:
        """This key's residual on the device of array ``like`` (a CUDA array of a library
        ringreduce has an array kind for: torch, cupy): float32, length n, zeros on first
        use, an array of like's library, moved there if it was elsewhere (a checkpoint
        loaded, or the key's calls moved). The stored array itself, as `residual`."""
        kind = kind_of(like)
        if kind is None:
            raise TypeError(
                f"ErrorFeedback: cannot keep a residual beside a {type(like).__name__} "
                "(ringreduce allocates torch and cupy arrays only); pass a float32 array "
                "of x's size on its device as error_feedback="
            )
        stored = self._store.get(self._prefix)
        if stored is None:
            stored = self._store[self._prefix] = kind.zeros(like, (int(n),), np.float32)
        self._check_size(stored, n)
        if kind_of(stored) is not kind or _device_of(stored) != _device_of(like):
            stored = self._store[self._prefix] = kind.from_host(like, _host(stored))
        return stored

    def _check_size(self, stored: Any, n: int) -> None:
        size = int(np.prod(stored.shape))
        if size != n:
            raise ValueError(
                f"ErrorFeedback: key {self._prefix or '(root)'!r} holds a residual of "
                f"{size} values, but this call reduces {n}; use one key per array "
                "(ef.key(name)), or reset() it"
            )

    def _mine(self, key: str) -> bool:
        p = self._prefix
        return not p or key == p or key.startswith(p + _SEP)

    def _relative(self, key: str) -> str:
        p = self._prefix
        return key if not p else ("" if key == p else key[len(p) + 1 :])

    def keys(self) -> List[str]:
        """The keys holding a residual in this view's subtree, relative to this view
        ("" is its own)."""
        return sorted(self._relative(k) for k in self._store if self._mine(k))

    def reset(self) -> None:
        """Forgets every residual of this view's subtree (they start from zeros again)."""
        for k in [k for k in self._store if self._mine(k)]:
            del self._store[k]

    def norm(self) -> float:
        """The L2 norm of all residuals of this view's subtree (what is still owed)."""
        held = [_host(v) for k, v in self._store.items() if self._mine(k)]
        return float(np.sqrt(sum(float(np.dot(v, v)) for v in held)))

    def state_dict(self) -> Dict[str, Any]:
        """{"version": 1, "residuals": {key: float32 array (a copy)}} of this subtree."""
        return {
            "version": _VERSION,
            "residuals": {
                self._relative(k): _host(v) for k, v in self._store.items() if self._mine(k)
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replaces this subtree's residuals with those of a `state_dict` (copied, as
        float32). ValueError for another version or a malformed dict."""
        if not isinstance(state, Mapping) or "residuals" not in state:
            raise ValueError("ErrorFeedback.load_state_dict: expected a dict from state_dict()")
        if state.get("version") != _VERSION:
            raise ValueError(
                f"ErrorFeedback.load_state_dict: version {state.get('version')!r} is not "
                f"{_VERSION}, the one this ringreduce reads"
            )
        loaded = {}
        for key, value in dict(state["residuals"]).items():
            arr = np.array(value, dtype=np.float32).reshape(-1)
            full = (
                self._prefix
                if key == ""
                else (f"{self._prefix}{_SEP}{key}" if self._prefix else key)
            )
            loaded[full] = arr
        self.reset()
        self._store.update(loaded)

    def __repr__(self) -> str:
        return f"<ringreduce.ErrorFeedback {self._prefix or '(root)'!r}: {len(self.keys())} keys>"


def _host(v: Any) -> np.ndarray:
    """A numpy copy of a stored residual, wherever it lives."""
    if isinstance(v, np.ndarray):
        return v.copy()
    kind = kind_of(v)
    if kind is None:  # pragma: no cover - only arrays of known kinds are stored
        raise TypeError(f"ErrorFeedback: cannot read a residual held in {type(v).__name__}")
    return np.asarray(kind.to_host(v), np.float32).reshape(-1)


def _device_of(v: Any) -> Any:
    """Where an array lives, as its library says (None for numpy)."""
    if isinstance(v, np.ndarray):
        return None
    device = getattr(v, "device", None)
    return getattr(device, "id", getattr(device, "index", device))
