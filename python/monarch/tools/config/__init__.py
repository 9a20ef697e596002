"""Monarch's tools.config namespace: `workspace.Workspace` is xmesh's (see
monarch.tools.config.workspace). `Config`, Monarch's torchx job specification (a scheduler, its
arguments, an AppDef), has no counterpart: xmesh's jobs are `monarch.job.SlurmJob` / `SSHJob`
(xmesh.SlurmJob / SSHJob). It can be imported; making one says so."""
from typing import Any


class Config:
    """Monarch's torchx job configuration; xmesh has none (its jobs: monarch.job.SlurmJob / SSHJob)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("monarch.tools.config.Config is Monarch's torchx job specification, which xmesh does "
                                  "not have: start jobs with monarch.job.SlurmJob / SSHJob (xmesh.SlurmJob / SSHJob), "
                                  "and sync a workspace with ProcMesh.sync_workspace(Workspace(...))")


__all__ = ["Config"]
