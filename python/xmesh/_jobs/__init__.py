"""Jobs: hosts from SLURM and SSH kept across kernel restarts (`job`, layer 2) and the host agent
a job starts on each of its nodes (`agent`, layer 3, run as `python -m xmesh._jobs.agent`)."""
