"""Every public function and method of the package (xmesh.__all__ and the classes in it,
their bases included) carries type hints on its parameters and its result; ctest's "typecheck:
mypy" checks them against the code (python/mypy.ini)."""
import inspect

import xmesh


def _unhinted(qualname, fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    params = [p for name, p in sig.parameters.items()
              if name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty and not qualname.endswith("__init__"):
        missing.append("return")
    return [f"{qualname}: {', '.join(missing)}"] if missing else []


def _public_functions(cls):
    for klass in cls.__mro__:
        if not klass.__module__.startswith("xmesh"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(value, property):
                value = value.fget
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value):
                yield f"{klass.__name__}.{name}", value


def test_the_public_api_is_typed():
    missing = []
    for name in xmesh.__all__:
        obj = getattr(xmesh, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException) or obj is xmesh.Actor:
                continue
            for qualname, fn in _public_functions(obj):
                missing += _unhinted(qualname, fn)
        elif callable(obj):
            missing += _unhinted(name, getattr(obj, "__call__") if not inspect.isfunction(obj) else obj)
    assert not missing, "public functions without type hints:\n" + "\n".join(sorted(set(missing)))


def test_the_package_namespace_is_its_public_api():
    """What `import xmesh` shows without an underscore is __all__ (and the public submodules once
    imported): the subpackages' modules the package imports for their registrations are bound
    under private names, not as `xmesh.remote` or `xmesh.view`."""
    public = {name for name in dir(xmesh) if not name.startswith("_")}
    assert public - set(xmesh.__all__) - {"rdma", "cli"} == set()
