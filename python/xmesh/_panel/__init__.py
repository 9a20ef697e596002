"""Layer 4, the mesh panel's Python side: what the panel shows of a controller (`view`) and the
sidecar process a Jupyter server's extension runs (`sidecar`, `python -m xmesh._panel.sidecar`)."""
