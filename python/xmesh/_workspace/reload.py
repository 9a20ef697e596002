"""The proc's side of `sync_workspace(auto_reload=True)`: reload the modules whose files a sync
changed, dependencies first, and update the classes of live actor instances in place so that
their methods run the new code."""
import importlib
import os
import sys

from .. import _core


def _file_of(module):
    f = getattr(module, "__file__", None)
    if not f:
        return None
    try:
        return os.path.realpath(f)
    except (OSError, ValueError):
        return None


def _depends_on(module, others):
    """The names of modules in `others` that `module`'s namespace refers to (imported modules,
    or functions and classes taken from them)."""
    found = set()
    for value in list(vars(module).values()):
        name = value.__name__ if isinstance(value, type(sys)) else getattr(value, "__module__", None)
        if isinstance(name, str) and name in others and name != module.__name__:
            found.add(name)
    # A package's submodules load before it (its __init__ usually imports them).
    prefix = module.__name__ + "."
    found.update(n for n in others if n.startswith(prefix))
    return found


def dependency_order(modules):
    """Modules ordered so that each comes after those it uses (name order breaks ties and cycles)."""
    by_name = {m.__name__: m for m in modules}
    deps = {n: _depends_on(m, by_name) for n, m in by_name.items()}
    ordered, done = [], set()
    while len(ordered) < len(by_name):
        ready = sorted(n for n in by_name if n not in done and deps[n] <= done)
        if not ready:  # a cycle: take the first remaining one
            ready = [sorted(n for n in by_name if n not in done)[0]]
        for n in ready:
            done.add(n)
            ordered.append(by_name[n])
    return ordered


def _functions_in(value):
    """The plain functions an attribute holds: itself, or those wrapped by a staticmethod,
    classmethod, property or @endpoint."""
    for attr in ("__func__", "fget", "fset", "fdel", "fn"):
        inner = getattr(value, attr, None)
        if inner is not None and inner is not value:
            yield from _functions_in(inner)
    if hasattr(value, "__code__") and hasattr(value, "__closure__"):
        yield value


def _rebind_class_cell(value, new, old):
    """Methods that use zero-argument super() (or __class__) close over the class they were
    defined in: point them at `old`, the class live instances have, or super() would fail."""
    for fn in _functions_in(value):
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if name == "__class__":
                try:
                    if cell.cell_contents is new:
                        cell.cell_contents = old
                except ValueError:  # an empty cell
                    pass


def _update_class(old, new):
    """Gives class `old` the attributes of `new` (methods, endpoints, class attributes), so that
    existing instances of `old` run the new code. Returns False if Python refused."""
    ok = True
    for key, value in list(new.__dict__.items()):
        if key in ("__dict__", "__weakref__", "__module__", "__qualname__"):
            continue
        _rebind_class_cell(value, new, old)
        try:
            setattr(old, key, value)
        except (AttributeError, TypeError):
            ok = False
    for key in [k for k in old.__dict__ if k not in new.__dict__]:
        if callable(old.__dict__[key]) and not key.startswith("__"):
            try:
                delattr(old, key)
            except (AttributeError, TypeError):
                ok = False
    return ok


def reload_files(paths):
    """Reloads every loaded module whose file is one of `paths` (absolute, on this host).
    Returns what it did: the modules reloaded, those that failed ([name, error]) and how many
    classes' live instances now use the new code."""
    importlib.invalidate_caches()
    targets = set()
    for p in paths:
        try:
            targets.add(os.path.realpath(p))
        except (OSError, ValueError):
            pass
    modules = [m for m in list(sys.modules.values()) if m is not None and _file_of(m) in targets]
    reloaded, failed, classes = [], [], 0
    for module in dependency_order(modules):
        old_namespace = dict(vars(module))
        if not os.path.exists(module.__file__):
            failed.append([module.__name__, f"its file {module.__file__} was deleted"])
            continue
        try:
            importlib.reload(module)
        except BaseException as e:  # a syntax error in the new text, an import that fails...
            failed.append([module.__name__, f"{type(e).__name__}: {e}"])
            continue
        reloaded.append(module.__name__)
        for name, old in old_namespace.items():
            new = vars(module).get(name)
            if isinstance(old, type) and isinstance(new, type) and new is not old \
                    and old.__module__ == module.__name__:
                if _update_class(old, new):
                    # The module keeps the class live instances have, so the next reload
                    # updates that class again (and `type(obj) is module.Cls` stays true).
                    setattr(module, name, old)
                    classes += 1
                else:
                    failed.append([f"{module.__name__}.{name}", "Python refused to update some attributes of the "
                                                              "class of live instances"])
    return _core.ReloadReply(reloaded=reloaded, failed=failed, classes=classes)
