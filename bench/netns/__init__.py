"""The parts of ``bench/netns_validate.py``: the model set against all_reduce measured on
emulated hosts (network namespaces with tbf-shaped links).

``cli`` reads the options and dispatches; ``namespaces`` brings the emulated hosts up and
down; ``run`` launches the ranks and measures; ``model_fit`` holds the model's numbers,
its predictions and the refit of a configuration's link; ``report`` writes validate.txt,
validate.png and validate.json. Rendering a validate.json needs neither root nor
ringreduce: ``report`` imports none of it, ``cli`` only where it is used.
"""

JUDGED_FROM = 16 << 20  # the model is judged at this size and above
TOLERANCE = 0.15
# tbf counts whole Ethernet frames; TCP payload is 1448 of every 1514 bytes at MTU 1500
# (20 bytes of IP header, 32 of TCP with timestamps, 14 of Ethernet header).
WIRE_EFFICIENCY = 1448 / 1514
DTYPE, ITEMSIZE = "float32", 4
PLACEMENTS = ("in-place", "out-of-place")
