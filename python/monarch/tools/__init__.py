"""Monarch's tools namespace: only what xmesh provides (the Workspace of sync_workspace)."""
