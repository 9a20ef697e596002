"""The mesh-aware debugger's Python side: the proc's pdb (`proc`, layer 3); the controller's
debugger (`controller`), where its prompt talks (`io`), the `xmesh_dbg>` prompt (`prompt`), why an
attach found no rank (`find`) and `xmesh debug` from another terminal (`remote`), layer 4."""
