"""The xmesh package's layers: a module imports only modules of its own layer or below (at
module level or inside a function alike, `from` and plain imports alike; the proc's entry points
are the named exceptions, COMPOSITION_ROOTS), within a layer only from a later group of modules
to an earlier one (SUBLAYERS), and the imports form no cycle. Upper layers reach
lower ones only through what the lower ones let them register (hooks, handlers, factories:
`_runtime.on_controller_start`, `_wait.add_wake_hook`, `_debug_io.set_frontend`...), never the
other way round. python/README.md and docs/architecture/README.md describe the layers."""
import ast
import os

import xmesh

LAYERS = [
    # 0 base: the C++ core's face and plain values
    ["_core", "_env", "_protocol", "_error_kinds", "_paths", "_shape", "_errors", "_pids", "_pickling",
     "_display", "_value_mesh", "_context", "_threads"],
    # 1 runtime: the process's node, the one wait, control messages, output, host agents
    ["_wait", "_control", "_runtime", "_logs", "_progress", "_hostd", "_logfiles", "_unix_server"],
    # 2 controller API: futures, actors, allocations, meshes, named allocations, workspace sync, jobs,
    #   RDMA buffers
    ["_future", "_actor", "_ports", "_allocation", "_proc_mesh", "_instance", "_controllers", "_named", "_workspace",
     "_jobs", "rdma"],
    # 3 proc and node side: hosting actors, output attribution, the proc's pdb, reloads, the worker,
    #   a job's node launcher, the host agent's fork server
    ["_actor_host", "_proc_output", "_debug_proc", "_reload", "_forkserver", "_worker", "_job_agent"],
    # 4 integration: the debugger's controller side and `xmesh debug`, the kernel, the command
    ["_debug_io", "_debug_prompt", "_debug_find", "_debug", "_debug_remote", "_panel", "_panel_sidecar", "_kernel", "_run_notebook", "cli", "__init__"],
]
LAYER_OF = {m: i for i, layer in enumerate(LAYERS) for m in layer}
PACKAGE = os.path.dirname(xmesh.__file__)


def package_modules():
    return sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py"))


def imports_of(module):
    """The package modules `module` imports, anywhere in its code."""
    with open(os.path.join(PACKAGE, module + ".py")) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "xmesh":
            parts = node.module.split(".")
            found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):  # `import xmesh` is the package itself; `import xmesh._x`, _x
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "xmesh":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
    return found & set(package_modules())


# Upward imports allowed by name: the proc's entry points are composition roots. A worker and a
# fork server run `import xmesh` (the top layer) once at start, so that every proc has the whole
# package and its upper layers' hooks registered before user code runs; nothing else may.
COMPOSITION_ROOTS = {("_worker", "__init__"), ("_forkserver", "__init__")}


# Within a layer, modules are ordered too: a lateral import goes from a later group to an earlier
# one, never back (the future does not know actors; the debugger's I/O does not know its prompt).
# One list of groups per layer, earliest first.
SUBLAYERS = [
    [["_core", "_env", "_error_kinds", "_paths", "_pids", "_threads", "_display", "_shape", "_pickling"],
     ["_protocol"], ["_errors", "_context", "_value_mesh"]],
    [["_wait", "_control", "_progress", "_unix_server", "_logfiles"], ["_logs"], ["_runtime"], ["_hostd"]],
    [["_future"], ["_actor", "_ports", "rdma", "_allocation", "_workspace"], ["_named"], ["_proc_mesh"],
     ["_controllers", "_instance", "_jobs"]],
    [["_proc_output", "_reload", "_forkserver", "_job_agent"], ["_debug_proc"], ["_actor_host"], ["_worker"]],
    [["_debug_io", "_debug_find", "_run_notebook"], ["_debug_prompt"], ["_debug"], ["_panel"], ["_kernel"],
     ["_debug_remote"], ["_panel_sidecar", "__init__"], ["cli"]],
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
    assert lateral_against_order({"_future": {"_actor"}}) == [("_future", "_actor")]


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
    assert "_kernel" not in imports_of("_debug") and "_debug" in imports_of("_kernel")  # the magic's lazy import
    assert "_proc_mesh" in imports_of("__init__") and "_runtime" in imports_of("_future")
    assert "__init__" in imports_of("_worker")  # a plain `import xmesh` counts too
    for root, target in COMPOSITION_ROOTS:  # every allowance is still needed
        assert target in imports_of(root), f"{root} no longer imports {target}: drop it from COMPOSITION_ROOTS"


# Private names a module may touch on objects that are not the package's: IPython's traceback
# hook (the kernel replaces it) and the marker the proc's pdb leaves on a user's exception.
# Third-party internals with no public equivalent: IPython's traceback hook, its exception
# lookup (where the kernel leaves xmesh's frames out) and its cell-file map ("Cell In [n]").
FOREIGN_PRIVATE = {("_kernel", "_showtraceback"), ("_kernel", "_get_exc_info"), ("_kernel", "_filename_map"),
                   ("_debug_proc", "_xmesh_post_mortem_done")}
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
        with open(os.path.join(PACKAGE, m + ".py")) as f:
            found += private_reads(f.read(), m)
    assert found == [], "private attributes read across modules (make what is needed public):\n" + "\n".join(found)


def test_the_private_read_check_sees_them():
    source = "class A:\n    def f(self, pm):\n        self._x = 1\n        return pm._alloc, pm._x, self._y\n"
    assert private_reads(source) == ["m:4: pm._alloc"]
