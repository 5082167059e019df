"""``@collective``: what every public collective of `Communicator` does around its body.

A collective that this rank refuses (bad arguments: ValueError/TypeError before it
reaches the engine) leaves the other ranks inside it. The engine records why, so that
their errors name this rank and its reason instead of only "rank 1 closed its
connection" or a mismatch with its next call.

The errors a collective documents (RingReduceError, and ValueError/TypeError for bad
arguments) reach the caller without the frames of the layers they came through here: the
call in the user's program, then one frame of ours, then the message. What caused them
stays attached (``__cause__``). Any other exception is a fault of ours and keeps every
frame.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from ...errors import RingReduceError

__all__ = ["collective"]

F = TypeVar("F", bound=Callable[..., Any])


def collective(method: F) -> F:
    """Wraps a public collective of Communicator (see the module's docstring). The
    communicator counts the calls it hands to the engine (``_issued_here``): a refusal
    raised before any is one the other ranks do not know of yet."""
    name = method.__name__.removeprefix("_")  # _all_reduce: all_reduce's general path

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self._issued_here
        try:
            return method(self, *args, **kwargs)
        except (ValueError, TypeError) as exc:
            if self._issued_here == before and self.world_size > 1:
                try:
                    self._core.note_refused_call(name, f"{type(exc).__name__}: {exc}")
                except Exception:  # noqa: BLE001 - the caller's error matters more
                    pass
            # The same error, its __cause__ and __context__ as they were (see above).
            raise exc.with_traceback(None)  # noqa: B904
        except RingReduceError as exc:
            exc = self._revoke(exc)
            raise exc.with_traceback(None)  # noqa: B904

    return checked  # type: ignore[return-value]
