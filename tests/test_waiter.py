"""The waiter's progress rule, through the real routed transport and waiter over two
scripted parts (``_core.testing.stalled_wait``): rank 0 of 4 waits for a message from a
peer that never sends it, while another rank keeps moving messages. Part "near" reaches
rank 1, part "far" ranks 2 and 3 (as shared memory and TCP do under shm+tcp).

Only what moves with the awaited peer renews the wait's window: traffic with another
rank, on the awaited peer's part or on the other one, must not keep a stalled wait
alive, or the rank waiting on the stalled peer times out late (or never, on a busy
link), and a rank further along the chain may time out first and blame the wrong rank.
"""

import pytest

from ringreduce import _core

TIMEOUT = 0.3
BUSY = 5.0  # seconds the other rank keeps moving: far longer than the timeout


@pytest.mark.parametrize(
    "awaited, busy, part",
    [
        (2, 3, "far"),  # another rank on the awaited peer's own part
        (2, 1, "far"),  # a rank on the other part
        (1, 2, "near"),
        (1, 3, "near"),
    ],
)
def test_traffic_with_another_rank_never_renews_a_stalled_wait(awaited, busy, part):
    seconds, kind, peer, message = _core.testing.stalled_wait(awaited, busy, BUSY, TIMEOUT)
    assert kind == "timeout" and peer == awaited, (kind, peer, message)
    # On time: the window was not renewed by the busy rank (which moves for 5 s).
    assert TIMEOUT <= seconds < TIMEOUT + 1.5, (seconds, message)
    # The one text of a stalled wait: how long, which way, how many bytes, whom, over what.
    assert message == (
        f"no progress for 0.3 s receiving 8 bytes from rank {awaited} over {part}"
    ), message


def test_traffic_with_the_awaited_rank_renews_the_wait():
    """The other side of the rule: while the awaited peer moves, the wait goes on (a
    large message on a slow link may take longer than the timeout); once it stops, the
    wait times out one window later."""
    moving = 1.0
    seconds, kind, peer, message = _core.testing.stalled_wait(2, 2, moving, TIMEOUT)
    assert kind == "timeout" and peer == 2, (kind, peer, message)
    assert moving + TIMEOUT * 0.9 <= seconds < moving + TIMEOUT + 1.5, (seconds, message)


def test_bad_ranks_are_refused():
    with pytest.raises(ValueError, match="ranks 1..3"):
        _core.testing.stalled_wait(0, 2, 1.0, TIMEOUT)
