"""Communicators, in rooms that import only downwards (tools/import_layers.py checks it):

- `core`: what one call is made of (operators, shaping, the issuing thread, refusals,
  Work, point-to-point messages, windows, composite collectives);
- `compressed` and `membership`: compressed collectives; who is in a communicator
  (agree, shrink, grow). Each knows the core, neither knows the other; `mpi` (the
  engine's communicators from mpi4py) sits beside them;
- `communicator`: `Communicator`, which composes them;
- `bootstrap` (``init``, ``join``): how one is made."""
