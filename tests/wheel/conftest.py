"""The wheel's tests use the helpers of tests/python (namespace hosts, the SLURM cluster,
running and waiting on programs)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
