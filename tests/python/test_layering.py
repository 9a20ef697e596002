"""The xmesh package's layers: a module imports only modules of its own layer or below (at
module level or inside a function alike, `from` and plain imports alike, relative or absolute; the
proc's entry points are the named exceptions, COMPOSITION_ROOTS), within a layer only from a later
group of modules to an earlier one (SUBLAYERS), and the imports form no cycle. The subpackages
(`_base`, `_runtime`, `_output`, `_api`, `_workspace`, `_jobs`, `_proc`, `_debug`, `_panel`,
`_kernel`) group modules by concept; a subpackage's `__init__` holds only its docstring, so
importing one module of it imports nothing else. Upper layers reach lower ones only through what
the lower ones let them register (hooks, handlers, factories: `_runtime.process.on_controller_start`,
`_runtime.wait.add_wake_hook`, `_debug.io.set_frontend`...), never the other way round.
python/README.md and docs/architecture/README.md describe the layers. Modules are named by their
dotted path under xmesh ("_api.future"; "__init__" is the package itself)."""
import ast

from xmesh_testing import package_modules as package_files

LAYERS = [
    # 0 base: the C++ core's face and plain values
    ["_core", "_kernel_ext", "_base.env", "_base.protocol", "_base.error_kinds", "_base.paths", "_base.install",
     "_base.shape", "_base.errors", "_base.pids", "_base.pickling", "_base.display", "_base.value_mesh", "_base.context",
     "_base.threads"],
    # 1 runtime: the process's node, the one wait, control messages, output, host agents
    ["_runtime.wait", "_runtime.control", "_runtime.fault_reports", "_runtime.process", "_runtime.agents",
     "_runtime.unix_server", "_output.logs", "_output.progress", "_output.logfiles"],
    # 2 controller API: futures, actors, allocations, meshes, named allocations, workspace sync, jobs,
    #   RDMA buffers
    ["_api.future", "_api.actor", "_api.ports", "_api.allocation", "_api.proc_mesh", "_api.instance",
     "_api.controllers", "_api.named", "_workspace.sync", "_jobs.records", "_jobs.kubernetes", "_jobs.control",
     "_jobs.job", "rdma"],
    # 3 proc and node side: hosting actors, output attribution, the proc's pdb, reloads, the worker,
    #   a job's node launcher, the host agent's fork server
    ["_proc.actor_host", "_proc.lifecycle", "_proc.owners", "_proc.actor_logging", "_proc.forkserver", "_proc.worker",
     "_output.capture", "_debug.proc", "_workspace.reload", "_jobs.agent"],
    # 4 integration: the debugger's controller side and `xmesh debug`, the panel, the kernel, the command
    ["_debug.io", "_debug.prompt", "_debug.find", "_debug.controller", "_debug.remote", "_panel.view",
     "_panel.sidecar", "_kernel.interpreter", "_kernel.run_notebook", "_kernel.comms", "_kernel.shell",
     "kernel.logo", "kernel.install", "kernel.serve", "kernel.__main__", "cli", "__init__"],
]
LAYER_OF = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def subpackage_inits():
    return sorted(m for m in package_files() if m.endswith(".__init__"))


def package_modules():
    """The package's modules but the subpackages' docstring-only __init__s."""
    return sorted(m for m in package_files() if not m.endswith(".__init__"))


def resolve(parts: list, names: list, known: set) -> set:
    """The modules `from <parts> import <names>` reaches: a module named by parts + name, else
    the module (or subpackage __init__) parts name."""
    found = set()
    base = ".".join(parts)
    for name in names:
        full = f"{base}.{name}" if base else name
        if full in known:
            found.add(full)
        elif f"{full}.__init__" in known:  # a subpackage itself (its __init__ imports nothing)
            found.add(f"{full}.__init__")
        elif base in known:
            found.add(base)
        elif not base:
            found.add("__init__")  # a name from the package itself
        elif f"{base}.__init__" in known:
            found.add(f"{base}.__init__")
    return found


def imports_of(module: str) -> set:
    """The package modules `module` imports, anywhere in its code."""
    files = package_files()
    known = set(files) | {"_core", "_kernel_ext"}
    with open(files[module]) as f:
        tree = ast.parse(f.read())
    own_package = module.split(".")[:-1]  # "_api.future" -> ["_api"]; "cli", "__init__" -> []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            parts = own_package[:len(own_package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            found |= resolve(parts, [a.name for a in node.names], known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "xmesh":
            found |= resolve(node.module.split(".")[1:], [a.name for a in node.names], known)
        elif isinstance(node, ast.Import):  # `import xmesh` is the package itself; `import xmesh._x.y`, _x.y
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "xmesh":
                    found.add(".".join(parts[1:]) if len(parts) > 1 else "__init__")
    return found & set(package_modules())  # _core and _kernel_ext, the C++ modules, are below everything


def test_a_subpackage_init_holds_only_its_docstring():
    assert len(subpackage_inits()) >= 10
    for init in subpackage_inits():
        with open(package_files()[init]) as f:
            body = ast.parse(f.read()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), \
            f"{init} must hold only its docstring"


# Upward imports allowed by name: the proc's entry points are composition roots. A worker and a
# fork server run `import xmesh` (the top layer) once at start, so that every proc has the whole
# package and its upper layers' hooks registered before user code runs; nothing else may.
COMPOSITION_ROOTS = {("_proc.worker", "__init__"), ("_proc.forkserver", "__init__")}


# Within a layer, modules are ordered too: a lateral import goes from a later group to an earlier
# one, never back (the future does not know actors; the debugger's I/O does not know its prompt).
# One list of groups per layer, earliest first.
SUBLAYERS = [
    [["_core", "_kernel_ext", "_base.env", "_base.error_kinds", "_base.paths", "_base.install", "_base.pids",
      "_base.threads", "_base.display", "_base.shape", "_base.pickling"],
     ["_base.protocol"], ["_base.errors", "_base.context", "_base.value_mesh"]],
    [["_runtime.wait", "_runtime.control", "_output.progress", "_runtime.unix_server", "_output.logfiles",
      "_runtime.fault_reports"],
     ["_output.logs"], ["_runtime.process"], ["_runtime.agents"]],
    [["_api.future", "_jobs.records"], ["_jobs.kubernetes"], ["_api.actor", "_api.ports", "rdma", "_api.allocation", "_workspace.sync",
      "_jobs.control"], ["_api.named"],
     ["_api.proc_mesh"], ["_api.controllers", "_api.instance", "_jobs.job"]],
    [["_output.capture", "_workspace.reload", "_proc.forkserver", "_jobs.agent", "_proc.lifecycle",
      "_proc.actor_logging", "_proc.owners"], ["_debug.proc"],
     ["_proc.actor_host"], ["_proc.worker"]],
    [["_debug.io", "_debug.find", "_kernel.run_notebook", "_kernel.comms", "kernel.logo"],
     ["_debug.prompt", "_kernel.shell", "kernel.install"], ["_debug.controller"], ["_panel.view"],
     ["_kernel.interpreter"], ["_debug.remote", "kernel.serve"], ["_panel.sidecar", "__init__", "kernel.__main__"],
     ["cli"]],
]
SUBLAYER_OF = {m: j for groups in SUBLAYERS for j, group in enumerate(groups) for m in group}


def lateral_against_order(imports: dict) -> list:
    """(module, imported) pairs of one layer where the imported module's group is not earlier."""
    return sorted((m, t) for m, targets in imports.items() for t in targets - {m}
                  if LAYER_OF[t] == LAYER_OF[m] and SUBLAYER_OF[t] >= SUBLAYER_OF[m]
                  and (m, t) not in COMPOSITION_ROOTS)


def test_the_sublayers_are_the_layers():
    assert [sorted(m for g in groups for m in g) for groups in SUBLAYERS] == [sorted(layer) for layer in LAYERS]


def test_no_lateral_import_goes_against_the_order_within_a_layer():
    assert lateral_against_order({m: imports_of(m) for m in package_modules()}) == []
    # The check can fail: the future importing actors would be caught.
    assert lateral_against_order({"_api.future": {"_api.actor"}}) == [("_api.future", "_api.actor")]


def test_every_module_has_a_layer():
    assert set(package_modules()) - set(LAYER_OF) == set(), "add new modules to a layer in this test"


def test_no_module_imports_an_upper_layer():
    upward = [(m, LAYER_OF[m], t, LAYER_OF[t]) for m in package_modules() for t in imports_of(m)
              if LAYER_OF[t] > LAYER_OF[m] and (m, t) not in COMPOSITION_ROOTS]
    assert upward == [], "module (layer) imports module (upper layer): " + repr(upward)


def test_the_imports_form_no_cycle():
    graph = {m: imports_of(m) - {m} for m in package_modules()}
    done, path, cycles = set(), [], []

    def visit(m):
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        path.append(m)
        for t in sorted(graph[m]):
            visit(t)
        path.pop()
        done.add(m)

    for m in graph:
        visit(m)
    assert cycles == [], "import cycles: " + repr(cycles)


def test_the_checks_see_imports(tmp_path):
    # The checker itself: a function-level import counts like a module-level one.
    assert "_kernel.interpreter" not in imports_of("_debug.controller")
    assert "_debug.controller" in imports_of("_kernel.interpreter")  # the magic's lazy import
    assert "_api.proc_mesh" in imports_of("__init__") and "_runtime.process" in imports_of("_api.future")
    assert "_runtime.wait" in imports_of("_api.future")  # `from .._runtime import wait as _wait`
    assert "_base.pickling" in imports_of("_api.future")  # `from .._base import pickling as _pickling`
    assert "__init__" in imports_of("_proc.worker")  # a plain `import xmesh` counts too
    for root, target in COMPOSITION_ROOTS:  # every allowance is still needed
        assert target in imports_of(root), f"{root} no longer imports {target}: drop it from COMPOSITION_ROOTS"


# Private names a module may touch on objects that are not the package's: IPython's traceback
# hook (the kernel replaces it) and the marker the proc's pdb leaves on a user's exception.
# Third-party internals with no public equivalent: IPython's traceback hook, its exception
# lookup (where the kernel leaves xmesh's frames out) and its cell-file map ("Cell In [n]").
FOREIGN_PRIVATE = {("_kernel.interpreter", "_showtraceback"), ("_kernel.interpreter", "_get_exc_info"),
                   ("_kernel.interpreter", "_filename_map"), ("_debug.proc", "_xmesh_post_mortem_done")}
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def private_reads(source, module="m"):
    """`x._name` in source where _name is not an attribute or method of a class defined in the
    same source (self._name / cls._name and module._name excepted): a private attribute of
    another module's object."""
    tree = ast.parse(source)
    own, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    own.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    own.update(t.id for t in item.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        if isinstance(node.value, ast.Name) and (node.value.id in ("self", "cls") or node.value.id in modules):
            continue
        if node.attr in own or node.attr in NAMEDTUPLE_API or (module, node.attr) in FOREIGN_PRIVATE:
            continue
        found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_attributes():
    found = []
    for m in package_modules():
        with open(package_files()[m]) as f:
            found += private_reads(f.read(), m)
    assert found == [], "private attributes read across modules (make what is needed public):\n" + "\n".join(found)


def test_the_private_read_check_sees_them():
    source = "class A:\n    def f(self, pm):\n        self._x = 1\n        return pm._alloc, pm._x, self._y\n"
    assert private_reads(source) == ["m:4: pm._alloc"]
