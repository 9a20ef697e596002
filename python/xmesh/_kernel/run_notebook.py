"""`xmesh run NOTEBOOK`: executes a notebook headlessly on the xmesh kernel (nbclient), prints
each cell's progress and outputs, writes the executed notebook, and fails with the failing
cell's error."""
import os
import re
import sys
import time

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _plain_outputs(outputs):
    """The text a console would show for a cell's outputs."""
    parts = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain")
            if text:
                parts.append(text if text.endswith("\n") else text + "\n")
        elif kind == "error":
            parts.append(_ANSI.sub("", "\n".join(out.get("traceback", []))) + "\n")
    return "".join(parts)


def run_notebook(path, output=None, timeout=600, kernel_name="xmesh", quiet=False, out=sys.stdout):
    """Executes the notebook at path; returns (exit code, path written)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    try:
        nb = nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise FileNotFoundError(f"no notebook at {path}") from None
    except Exception as e:
        raise ValueError(f"{path} is not a readable notebook: {type(e).__name__}: {e}") from None
    if output is None:
        root, _ = os.path.splitext(path)
        output = root + ".out.ipynb"
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    started = {}

    def on_cell_start(cell, cell_index):
        started[cell_index] = time.monotonic()

    def on_cell_executed(cell, cell_index, execute_reply):
        n = code_cells.index(cell) + 1 if cell in code_cells else cell_index + 1
        status = execute_reply["content"]["status"] if execute_reply else "ok"
        took = time.monotonic() - started.get(cell_index, time.monotonic())
        out.write(f"[{n}/{len(code_cells)}] cell {cell_index + 1}: {status} ({took:.1f} s)\n")
        if not quiet:
            text = _plain_outputs(cell.get("outputs", []))
            if text:
                out.write("".join("    " + line for line in text.splitlines(keepends=True)))
        out.flush()

    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=False,
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}},
                            on_cell_start=on_cell_start, on_cell_executed=on_cell_executed)
    code = 0
    try:
        client.execute()
    except CellExecutionError as e:
        code = 1
        out.write(f"xmesh run: a cell of {path} failed:\n{_ANSI.sub('', str(e))}\n")
    finally:
        nbformat.write(nb, output)
    out.write(f"wrote {output}\n")
    return code, output
