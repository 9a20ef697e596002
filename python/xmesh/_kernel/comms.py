"""Jupyter comms in the xmesh kernel, on xeus's comm manager (`xmesh._kernel_ext.Comm`,
kernel/comms.cpp): `Comm` and `CommManager` with ipykernel's surface
(`get_ipython().kernel.comm_manager.register_target(...)`), and the `comm` package's entry points
(`comm.create_comm`, `comm.get_comm_manager`, which ipywidgets 8 calls) pointed at them."""
import importlib
import uuid
from typing import Any, Callable, Optional

from .. import _kernel_ext


class Comm:
    """One comm: opened here (primary: comm_open goes to the front end at once) or by the front
    end (given to a target's callback)."""

    def __init__(self, target_name: str = "comm", data: Any = None, metadata: Any = None, buffers: Any = None,
                 comm_id: Optional[str] = None, primary: bool = True, _handle: Any = None, **kwargs: Any) -> None:
        self._handle = _handle if _handle is not None else _kernel_ext.Comm(target_name, comm_id or uuid.uuid4().hex)
        self.comm_id: str = self._handle.comm_id
        self.target_name: str = self._handle.target_name
        self.primary = primary
        self._closed = True
        self._msg_callback: Optional[Callable[[dict], Any]] = None
        self._close_callback: Optional[Callable[[dict], Any]] = None
        self._handle.on_message(self.handle_msg)
        self._handle.on_close(self.handle_close)
        _manager.register_comm(self)
        if _handle is not None:
            self._closed = False  # the front end opened it
        elif primary:
            self.open(data, metadata, buffers)

    @property
    def kernel(self) -> Any:
        from IPython import get_ipython

        shell = get_ipython()
        return getattr(shell, "kernel", None)

    def open(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self._handle.open(data, metadata, buffers)
        self._closed = False

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self._handle.send(data, metadata, buffers)

    def close(self, data: Any = None, metadata: Any = None, buffers: Any = None, deleting: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._handle.close(data, metadata, buffers)
        self._forget()

    def on_msg(self, callback: Optional[Callable[[dict], Any]]) -> None:
        self._msg_callback = callback

    def on_close(self, callback: Optional[Callable[[dict], Any]]) -> None:
        self._close_callback = callback

    def handle_msg(self, msg: dict) -> None:
        if self._msg_callback is not None:
            self._msg_callback(msg)

    def handle_close(self, msg: dict) -> None:
        self._closed = True
        if self._close_callback is not None:
            self._close_callback(msg)
        self._forget()

    def _forget(self) -> None:
        # The handle's handlers refer back to this object, out of the garbage collector's sight.
        self._handle.on_message(None)
        self._handle.on_close(None)
        _manager.unregister_comm(self)


class CommManager:
    """The kernel's comms by id and the targets front ends open comms on."""

    def __init__(self) -> None:
        self.comms: dict = {}
        self.targets: dict = {}

    def register_target(self, target_name: str, f: Any) -> None:
        if isinstance(f, str):  # "module.function", as ipykernel accepts
            module, _, name = f.rpartition(".")
            f = getattr(importlib.import_module(module), name)
        self.targets[target_name] = f
        _kernel_ext.register_target(target_name, lambda handle, msg: self._opened(target_name, handle, msg))

    def unregister_target(self, target_name: str, f: Any = None) -> None:
        self.targets.pop(target_name, None)
        _kernel_ext.unregister_target(target_name)

    def register_comm(self, comm: Comm) -> str:
        self.comms[comm.comm_id] = comm
        return comm.comm_id

    def unregister_comm(self, comm: Comm) -> None:
        self.comms.pop(comm.comm_id, None)

    def get_comm(self, comm_id: str) -> Optional[Comm]:
        return self.comms.get(comm_id)

    def _opened(self, target_name: str, handle: Any, msg: dict) -> None:
        comm = Comm(_handle=handle, primary=False)
        f = self.targets.get(target_name)
        try:
            if f is not None:
                f(comm, msg)
        except Exception:
            comm.close()
            raise


_manager = CommManager()


def manager() -> CommManager:
    return _manager


def install() -> None:
    """Points the `comm` package, where installed, at this kernel's comms."""
    try:
        import comm
    except ImportError:
        return
    comm.create_comm = Comm  # type: ignore[assignment]
    comm.get_comm_manager = manager  # type: ignore[assignment]
