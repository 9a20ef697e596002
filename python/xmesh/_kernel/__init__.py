"""Layer 4, the Jupyter kernel's Python side: what kernel/xmesh_interpreter.cpp calls
(`interpreter`) and `xmesh run NOTEBOOK` (`run_notebook`)."""
