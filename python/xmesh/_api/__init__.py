"""Layer 2, the controller's API: futures, actors and endpoints, ports, allocations, host and
proc meshes, named allocations, Monarch's controllers and context(). The package's `__init__`
re-exports the public names."""
