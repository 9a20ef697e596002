"""Layer 1, a process's runtime: its node (`process`), the one wait every blocking path goes
through (`wait`), the control-message table (`control`), the clients of host agents (`agents`)
and the user-only unix-socket server (`unix_server`)."""
