"""`from monarch.tools.config.workspace import Workspace`: xmesh's Workspace (dirs=[...] or
{local: remote}) for sync_workspace."""
from xmesh._workspace.sync import Workspace

__all__ = ["Workspace"]
