"""Python `logging` records made by actor code carry the actor (Monarch's): each record's
message starts with "[actor=<root>.<mod.Class mesh{'gpus': 1/4}>] " and the record has
`.actor_prefix`, so whatever handler or formatter the program uses shows who logged. Installed
as logging's record factory (not a filter on handlers: handlers added later are covered too) in
every proc, and in the controller by the monarch shim (where the program's own records get
"[actor=<root>] ", as in Monarch). XMESH_LOG_ACTOR_PREFIX=0 turns it off in procs; the shim's
`monarch.actor.config.prefix_python_logs_with_actor` turns it off where it is set."""
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
            instance = context().actor_instance
            in_actor = instance.class_name is not None
            if record.msg and (in_actor or root_too) and enabled():
                prefix = f"[actor={instance!r}] "
                record.actor_prefix = prefix
                record.msg = f"{prefix}{record.msg}"
        except Exception:  # never lose a record over its prefix
            pass
        return record

    logging.setLogRecordFactory(factory)


def enabled_in_procs() -> bool:
    return os.environ.get("XMESH_LOG_ACTOR_PREFIX", "1") not in ("0", "")
