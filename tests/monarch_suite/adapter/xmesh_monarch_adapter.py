"""What lets Monarch's own tests import Monarch's private module paths on xmesh: a meta path
finder, installed in every process of the suite's venv by a .pth file (run_monarch_suite.py).
Every name it gives is either xmesh's real object (the one `monarch.actor` or `xmesh` exports:
an alias, never a copy) or a placeholder that raises NotImplementedError naming the Monarch
internal when a test uses it. Nothing is faked: a test
that needs Monarch's Rust internals fails, saying which.

The private modules and their names are the table ALIASES below; a private module not in the
table imports as a module of placeholders."""
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Dict, Optional

# Monarch's private module -> {name there: "module:name" of xmesh's real object}.
ALIASES: Dict[str, Dict[str, str]] = {
    "monarch._src.actor.actor_mesh": {
        "Actor": "monarch.actor:Actor", "ActorError": "monarch.actor:ActorError",
        "ActorMesh": "monarch.actor:ActorMesh", "Channel": "monarch.actor:Channel", "Port": "monarch.actor:Port",
        "PortReceiver": "monarch.actor:PortReceiver", "ValueMesh": "monarch.actor:ValueMesh",
        "context": "monarch.actor:context", "current_rank": "monarch.actor:current_rank",
        "current_size": "monarch.actor:current_size", "current_actor_name": "monarch.actor:current_actor_name",
        "as_endpoint": "monarch.actor:as_endpoint", "send": "monarch.actor:send",
        "Accumulator": "monarch.actor:Accumulator", "Point": "monarch.actor:Point", "Extent": "monarch.actor:Extent",
    },
    "monarch._src.actor.endpoint": {"endpoint": "monarch.actor:endpoint", "Endpoint": "monarch.actor:Endpoint"},
    "monarch._src.actor.future": {"Future": "monarch.actor:Future"},
    "monarch._src.actor.host_mesh": {
        "HostMesh": "monarch.actor:HostMesh", "this_host": "monarch.actor:this_host",
        "this_proc": "monarch.actor:this_proc",
    },
    "monarch._src.actor.proc_mesh": {
        "ProcMesh": "monarch.actor:ProcMesh", "get_or_spawn_controller": "monarch.actor:get_or_spawn_controller",
        "proc_mesh": "monarch.actor:proc_mesh",
    },
    "monarch._src.actor.bootstrap": {
        "attach_to_workers": "monarch.actor:attach_to_workers",
        "run_worker_loop_forever": "monarch.actor:run_worker_loop_forever",
    },
    "monarch._src.actor.supervision": {"MeshFailure": "monarch.actor:MeshFailure"},
    "monarch._src.job.job": {"JobTrait": "monarch.job:JobTrait", "LocalJob": "monarch.job:LocalJob"},
    "monarch._src.job.process": {"ProcessJob": "monarch.job:ProcessJob"},
    "monarch._rust_bindings.monarch_hyperactor.supervision": {
        "SupervisionError": "monarch.actor:SupervisionError", "MeshFailure": "monarch.actor:MeshFailure",
    },
    "monarch._rust_bindings.monarch_hyperactor.shape": {
        "Point": "monarch.actor:Point", "Extent": "monarch.actor:Extent",
    },
}

# Monarch's private packages: served as modules of aliases and placeholders.
PREFIXES = ("monarch._src", "monarch._rust_bindings")


class Internal:
    """Stands for a Monarch internal xmesh has no counterpart of: usable as a name (imports,
    annotations, isinstance checks against it are False), raising once a test uses it."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self._qualname} is Monarch's internal; xmesh has no counterpart "
                                  "(tests/monarch_suite/README.md)")

    __call__ = _refuse
    __enter__ = _refuse
    __iter__ = _refuse

    def __getitem__(self, item: Any) -> "Internal":
        return self  # a generic's parameters, in annotations (Shared[HyProcMesh])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()

    def __instancecheck__(self, obj: Any) -> bool:
        return False

    def __mro_entries__(self, bases: tuple) -> tuple:
        """A test class deriving from the internal: defined, refusing to be made."""
        refuse = self._refuse

        class _InternalBase:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                refuse()

        _InternalBase.__qualname__ = self._qualname
        return (_InternalBase,)

    def __repr__(self) -> str:
        return f"<Monarch internal {self._qualname}>"


def _resolve(target: str, qualname: str) -> Any:
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except NotImplementedError:  # a Monarch name xmesh's shim says it does not have
        return Internal(qualname)


class _PrivateModule(types.ModuleType):
    """A private Monarch module: its aliases, then placeholders for anything else."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = ALIASES.get(self.__name__, {}).get(name)
        qualname = f"{self.__name__}.{name}"
        value = _resolve(target, qualname) if target else Internal(qualname)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(PREFIXES) or fullname in sys.modules:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PrivateModule(spec.name)
        module.__path__ = []  # a package: its submodules come through this finder too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()  # at interpreter start (the .pth file), before anything imports monarch
