"""Monarch's get_or_spawn_controller: one actor per name per controller (the program or the
notebook's kernel), spawned on the controller's own process (this_proc()) and found again by
name, from the controller (in any later cell) and from every actor it spawned, directly or
through other actors. A registry actor in the controller keeps them; it is spawned with the
controller's first actor mesh, so every actor's spawn can carry its handle (_proc_mesh's
registry provider, wired here)."""
import threading
from typing import Any, Optional

from .actor import Actor, ActorMesh, endpoint
from .._base.context import actor_context, actor_handles
from .future import Future
from .proc_mesh import set_registry_provider, this_proc
from .._runtime.process import get_runtime
from .._base.threads import OWN_ACTOR_PREFIX

REGISTRY_NAME = OWN_ACTOR_PREFIX + "controllers"  # xmesh's own actor (_base/threads.py)


class ControllerRegistry(Actor):
    """Lives in the controller: {name: (the controller's actor mesh, its class name)}."""

    def __init__(self) -> None:
        self._controllers: "dict[str, tuple[ActorMesh, str]]" = {}

    @endpoint
    def get_or_spawn(self, name: str, cls: type, args: tuple, kwargs: dict) -> ActorMesh:
        found = self._controllers.get(name)
        if found is None:
            found = (this_proc().spawn(name, cls, *args, **kwargs), cls.__qualname__)
            self._controllers[name] = found
        elif found[1] != cls.__qualname__:
            raise TypeError(f"controller {name!r} is a {found[1]} already; get_or_spawn_controller({name!r}, "
                            f"{cls.__qualname__}) cannot return it (use another name)")
        return found[0]

    @endpoint
    def names(self) -> "list[str]":
        return sorted(self._controllers)


class _Registry:
    """The controller's registry actor, spawned once (None while it is being spawned: its own
    spawn carries no registry)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._mesh: Optional[ActorMesh] = None
        self._spawning = False

    def get(self) -> Optional[ActorMesh]:
        with self._lock:
            if self._mesh is None and not self._spawning:
                self._spawning = True
                try:
                    self._mesh = this_proc().spawn(REGISTRY_NAME, ControllerRegistry)
                finally:
                    self._spawning = False
            return self._mesh


_registry = _Registry()


def _registry_for_spawn() -> Optional[ActorMesh]:
    """What a spawn from here hands its actors: the controller's registry (spawned now if it is
    the first), or, in an actor, the one its own spawn carried."""
    if get_runtime().role == "controller":  # its own registry, also for its this_proc() actors
        return _registry.get()
    ctx = actor_context()
    if ctx is None or ctx.handles is None:
        return None
    return actor_handles(ctx)[3]


set_registry_provider(_registry_for_spawn)


def get_or_spawn_controller(name: str, Class: type, *args: Any, **kwargs: Any) -> "Future[Any]":
    """The actor named `name` of this controller, spawned with Class(*args, **kwargs) on the
    controller's process the first time it is asked for (Monarch's): a Future of its ActorMesh
    (of one actor). The same name later, from the controller or any of its actors, gives the
    same actor; a different class under a taken name raises TypeError."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"get_or_spawn_controller() needs a name (a non-empty str), got {name!r}")
    if not isinstance(Class, type) or not issubclass(Class, Actor):
        raise TypeError(f"get_or_spawn_controller() needs a subclass of Actor, got {Class!r}")
    registry = _registry_for_spawn()
    if registry is None:
        raise RuntimeError("get_or_spawn_controller() from here: this code runs outside an actor of a proc (a "
                           "thread of its own?), where the controller's registry is not known; call it from an "
                           "endpoint")
    return registry.get_or_spawn.call_one(name, Class, args, kwargs)
