"""The type stub of the pybind11 module (python/xmesh/_core.pyi, written by scripts/core_stub.sh)
says what the built module has: the same functions and classes, and each class the same public
methods and attributes. A binding added, renamed or removed without regenerating the stub fails
here, naming what differs."""
import ast
import inspect
import keyword
import os

from xmesh import _core

SOURCE = os.environ.get("XMESH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
STUB = os.path.join(SOURCE, "python", "xmesh", "_core.pyi")


def stub_names(tree: ast.Module) -> tuple:
    """The stub's top-level names, and each class's member names."""
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            names = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            members[node.name] = names
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            top.add(node.name)
    return top, members


def module_names() -> tuple:
    top = {n for n in dir(_core) if not n.startswith("_")}
    members = {}
    for name in top:
        obj = getattr(_core, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            own = set()
            for klass in obj.__mro__:
                if klass is object or klass.__module__ == "pybind11_builtins":
                    continue
                own.update(n for n in vars(klass) if not n.startswith("_") and not keyword.iskeyword(n))
            members[name] = own
    return top, members


def differences(stub: tuple, module: tuple) -> list:
    (stub_top, stub_members), (mod_top, mod_members) = stub, module
    found = [f"the module has {n}, the stub does not" for n in sorted(mod_top - stub_top)]
    found += [f"the stub has {n}, the module does not" for n in sorted(stub_top - mod_top)]
    for cls, names in sorted(mod_members.items()):
        in_stub = {n for n in stub_members.get(cls, set()) if not n.startswith("_")}
        found += [f"{cls}.{n}: in the module, not the stub" for n in sorted(names - in_stub)]
        found += [f"{cls}.{n}: in the stub, not the module" for n in sorted(in_stub - names)]
    return found


def test_the_stub_says_what_the_module_has():
    stub = stub_names(ast.parse(open(STUB).read()))
    assert differences(stub, module_names()) == [], "regenerate it: scripts/core_stub.sh"


def test_a_binding_missing_from_the_stub_is_named():
    """The check can fail: a stub without Node.send and without select_ranks is reported."""
    tree = ast.parse(open(STUB).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Node":
            node.body = [i for i in node.body if getattr(i, "name", None) != "send"]
    tree.body = [n for n in tree.body if getattr(n, "name", None) != "select_ranks"]
    found = differences(stub_names(tree), module_names())
    assert "Node.send: in the module, not the stub" in found
    assert "the module has select_ranks, the stub does not" in found
