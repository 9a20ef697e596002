"""Compatibility package: programs written for PyTorch Monarch's `monarch.actor` run on xmesh."""
