"""Workspaces: `sync_workspace` pushing local directories to every host agent (`sync`, layer 2)
and a proc's reload of the modules a sync changed (`reload`, layer 3)."""
