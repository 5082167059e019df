"""Communicators: `Communicator` and `Work` (the collectives and point-to-point calls over
the engine), how a call's arguments are shaped (`shaping`), which thread issues it
(`issuer`), the errors of refused calls (`refusal`), reduction operators (`ops`),
collectives built from the others (`composite`), and how a communicator is made
(`bootstrap`: ``init``; `mpi`: from mpi4py)."""
