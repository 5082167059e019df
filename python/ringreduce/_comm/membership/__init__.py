"""Who is in a communicator: the standby stores every member keeps (`arming`), agreeing
and shrinking among the survivors (`agreement`), growing with newcomers (`growth`),
meeting on a store (`meeting`), whether a process is alive (`processes`), and the
communicator's face for all of it (`resilience`). It knows the core room, never
compression."""
