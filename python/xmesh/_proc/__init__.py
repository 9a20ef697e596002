"""Layer 3, a proc: its main program (`worker`, `python -m xmesh._proc.worker`), the host agent's
fork server (`forkserver`) and the proc side of actors (`actor_host`)."""
