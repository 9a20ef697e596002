"""The wheel's tests use the helpers of tests/python (namespace hosts, the SLURM cluster,
running and waiting on programs) and tests/kernel (kernel sessions, the protocol suite)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "kernel"))
