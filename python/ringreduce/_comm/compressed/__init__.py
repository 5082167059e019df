"""Compressed collectives (``compression=`` on all_reduce and reduce_scatter): which path
a call takes and the state it keeps (`route`), auto's decisions (`auto`), the one-hop
schedule on host arrays (`hop`) and on device arrays (`device`), pieces (`pieces`) and
the lane that runs async compressed calls in issue order (`lane`). It knows the core
room, never membership."""
