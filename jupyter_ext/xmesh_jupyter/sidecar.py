"""The process that reads xmesh for the server: `python -m xmesh._panel.sidecar` under the
Python that has xmesh (XMESH_PANEL_PYTHON, default Debian's /usr/bin/python3), speaking JSON
lines on its standard input and output. One request at a time; one that takes longer than
REQUEST_TIMEOUT_S ends the sidecar (the next request starts a new one), so a stuck agent never
blocks the server. It inherits the server's environment (XMESH_RUNTIME_DIR, PYTHONPATH)."""
import asyncio
import json
import os
from typing import Any, Dict, Optional

REQUEST_TIMEOUT_S = 15.0
MAX_ANSWER_BYTES = 64 << 20


class Sidecar:
    def __init__(self, log: Any, python: Optional[str] = None) -> None:
        self.log = log
        self.python = python or os.environ.get("XMESH_PANEL_PYTHON", "/usr/bin/python3")
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._lock = asyncio.Lock()

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "xmesh._panel.sidecar", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=None, limit=MAX_ANSWER_BYTES)
        return self._proc

    async def request(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """The sidecar's answer, or {"error": why} (it could not start, died, or took too long)."""
        async with self._lock:
            try:
                proc = await self._started()
            except OSError as e:
                return {"error": f"the xmesh sidecar cannot start ({self.python} -m xmesh._panel.sidecar): {e}"}
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write((json.dumps(msg) + "\n").encode())
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), REQUEST_TIMEOUT_S)
            except (asyncio.TimeoutError, OSError, ValueError) as e:
                self._end(proc)
                why = f"no answer within {REQUEST_TIMEOUT_S:.0f} s" if isinstance(e, asyncio.TimeoutError) else str(e)
                return {"error": f"the xmesh sidecar failed: {why}"}
            if not line:
                self._end(proc)
                return {"error": f"the xmesh sidecar exited (code {await proc.wait()}): is xmesh installed for "
                                 f"{self.python}?"}
            try:
                return json.loads(line)
            except ValueError:
                return {"error": "the xmesh sidecar answered something that is not JSON"}

    def _end(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            proc.kill()
        self._proc = None

    def close(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
