"""`python -m xmesh.kernel`: serve a kernel (-f CONNECTION_FILE) or `install` its kernelspec."""
import sys

from . import install, serve

args = sys.argv[1:]
sys.exit(install.main(args[1:]) if args[:1] == ["install"] else serve.main(args))
