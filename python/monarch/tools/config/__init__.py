"""Monarch's tools.config namespace (see monarch.tools.config.workspace)."""
