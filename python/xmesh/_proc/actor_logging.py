"""Python `logging` records made by actor code carry the actor, as Monarch's do: each record's
message starts with "[actor=<root>.<mod.Class mesh{'gpus': 1/4}>] " and the record has
`.actor_prefix`, so whatever handler or formatter the program uses shows who logged. Installed
as logging's record factory (not a filter on handlers: handlers added later are covered too) in
every proc, where it acts when XMESH_LOG_ACTOR_PREFIX=1: the monarch shim sets that for the procs
of a program that imports it (`monarch.actor.config.prefix_python_logs_with_actor`, True by
default) and prefixes the program's own records ("[actor=<root>] "), as Monarch does. xmesh's own
programs go without: their procs' lines are already labeled by mesh and rank."""
import logging
import os
from typing import Callable

from .._api.instance import context

_installed = False


def install(enabled: Callable[[], bool], root_too: bool = False) -> None:
    """Prefixes records made in actors (and, with root_too, in the program itself) while
    enabled() says so. Once per process; later calls change nothing."""
    global _installed
    if _installed:
        return
    _installed = True
    make = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = make(*args, **kwargs)
        try:
            if not record.msg or not enabled():  # off (xmesh's own programs): nothing more per record
                return record
            instance = context().actor_instance
            if instance.class_name is not None or root_too:
                prefix = f"[actor={instance!r}] "
                record.actor_prefix = prefix
                record.msg = f"{prefix}{record.msg}"
        except Exception:  # never lose a record over its prefix
            pass
        return record

    logging.setLogRecordFactory(factory)


def enabled_in_procs() -> bool:
    return os.environ.get("XMESH_LOG_ACTOR_PREFIX") == "1"
