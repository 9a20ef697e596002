"""The xmesh Jupyter kernel, run by the Python it is installed in.

    python -m xmesh.kernel install [--user | --sys-prefix | --prefix P] [--name N] [--display-name D]
    python -m xmesh.kernel -f CONNECTION_FILE        (what a kernelspec's argv runs)

`install` (kernel/install.py) writes a kernelspec (ipykernel's flags and meanings) whose argv
starts with this interpreter, so the notebook's cells, and every proc they start, see this
environment's packages; `serve` (kernel/serve.py) runs the kernel module, xmesh._kernel_ext.
"""
