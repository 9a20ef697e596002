"""Layer 0, the base: the C++ core's plain values and enums for Python (the protocol's kinds and
error kinds, shapes and points, value meshes), the exceptions a caller sees, environment knobs,
pickling, pids and the current actor's context. Imports nothing of xmesh but `_core`."""
