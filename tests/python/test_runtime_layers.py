"""The C++ runtime's layers (runtime/README.md, docs/architecture): each folder of runtime/ is a
library that links only to the layers below it and publishes only its own folder as include
path, so that an #include of a layer above (or beside) is a build error. These tests read the
layers from runtime/*/CMakeLists.txt, check that every source belongs to one, that each
includes only what its layer may use, that the compiler is given exactly those paths, and that
an upward include does not compile."""
import json
import os
import re
import subprocess

import pytest

SOURCE = os.environ.get("XMESH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("XMESH_BUILD_DIR", os.path.join(SOURCE, "build"))
RUNTIME = os.path.join(SOURCE, "runtime")
# The layers, bottom up, and what each may use: the order runtime/CMakeLists.txt documents.
EXPECTED = {
    "base": set(),
    "protocol": {"base"},
    "transport": {"protocol", "base"},
    "node": {"transport", "protocol", "base"},
    "cast": {"node", "transport", "protocol", "base"},
    "output": {"node", "transport", "protocol", "base"},
    "data": {"node", "transport", "protocol", "base"},
}
HEADER_SUFFIXES = (".hpp", ".def")


def declared_layers() -> dict:
    """Each layer's USES list as its CMakeLists.txt declares it (xmesh_runtime_layer)."""
    layers = {}
    for name in sorted(os.listdir(RUNTIME)):
        cmake = os.path.join(RUNTIME, name, "CMakeLists.txt")
        if not os.path.isfile(cmake) or name == "hostd":
            continue
        text = open(cmake).read()
        m = re.search(r"xmesh_runtime_layer\((\w+)(.*?)\)", text, re.S)
        assert m and m.group(1) == name, f"runtime/{name}/CMakeLists.txt does not make the layer {name}"
        uses = re.search(r"USES([\w\s]*)$", m.group(2))
        layers[name] = set(uses.group(1).split()) if uses else set()
    return layers


def layer_files(layer: str) -> list:
    folder = os.path.join(RUNTIME, layer)
    return sorted(f for f in os.listdir(folder) if f != "CMakeLists.txt" and f != "README.md")


def header_homes() -> dict:
    """Header name -> the layer whose folder holds it."""
    homes = {}
    for layer in EXPECTED:
        for f in layer_files(layer):
            if f.endswith(HEADER_SUFFIXES):
                assert f not in homes, f"{f} is in both runtime/{homes[f]} and runtime/{layer}"
                homes[f] = layer
    homes["build_info.hpp"] = "protocol"  # generated from protocol/build_info.hpp.in
    return homes


def test_the_build_declares_the_documented_layers():
    """Invariant: the layers and their uses are the ones runtime/CMakeLists.txt documents."""
    declared = declared_layers()
    # What a layer may use is what it declares, and everything those use (the libraries link on).
    closed = {}
    for name in EXPECTED:
        seen, todo = set(), list(declared.get(name, ()))
        while todo:
            below = todo.pop()
            if below not in seen:
                seen.add(below)
                todo.extend(declared.get(below, ()))
        closed[name] = seen
    assert set(declared) == set(EXPECTED)
    assert closed == EXPECTED


def test_every_runtime_file_belongs_to_a_layer():
    loose = [f for f in os.listdir(RUNTIME)
             if os.path.isfile(os.path.join(RUNTIME, f)) and f not in ("CMakeLists.txt", "README.md")]
    assert loose == [], "files of runtime/ outside a layer's folder: " + repr(loose)
    for layer in list(EXPECTED) + ["hostd"]:
        assert os.path.isfile(os.path.join(RUNTIME, layer, "README.md")), f"runtime/{layer} has no README.md"


def test_each_layer_includes_only_itself_and_what_it_uses():
    homes = header_homes()
    wrong = []
    for layer, uses in EXPECTED.items():
        for f in layer_files(layer):
            text = open(os.path.join(RUNTIME, layer, f), errors="replace").read()
            for included in re.findall(r'#include\s+"([^"]+)"', text):
                home = homes.get(os.path.basename(included))
                if home is not None and home != layer and home not in uses:
                    wrong.append(f"runtime/{layer}/{f} includes {included} (runtime/{home})")
    assert wrong == []


def compile_commands() -> list:
    path = os.path.join(BUILD, "compile_commands.json")
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: configure the build (CMAKE_EXPORT_COMPILE_COMMANDS is on)")
    with open(path) as f:
        return json.load(f)


def include_dirs(command: str) -> list:
    return [d for d in re.findall(r"(?:^|\s)-I(\S+)", command)]


def layer_command(entries: list, layer: str) -> dict:
    folder = os.path.realpath(os.path.join(RUNTIME, layer)) + os.sep
    for e in entries:
        if os.path.realpath(e["file"]).startswith(folder):
            return e
    pytest.fail(f"no source of runtime/{layer} is in compile_commands.json")


def test_the_compiler_sees_only_the_folders_a_layer_may_use():
    entries = compile_commands()
    runtime_root = os.path.realpath(RUNTIME) + os.sep
    for layer, uses in EXPECTED.items():
        e = layer_command(entries, layer)
        seen = {os.path.relpath(os.path.realpath(d), RUNTIME) for d in include_dirs(e["command"])
                if os.path.realpath(d).startswith(runtime_root)}
        assert seen == {layer} | uses, f"runtime/{layer} compiles with {sorted(seen)}"


@pytest.mark.parametrize("layer", sorted(EXPECTED))
def test_an_include_from_a_layer_above_does_not_compile(layer, tmp_path):
    """An upward (or lateral) #include is a build error: a header of a layer this one may not use,
    included from a file
    compiled as this layer is, is not found; the layer's own header is."""
    entries = compile_commands()
    e = layer_command(entries, layer)
    flags = [f"-I{d}" for d in include_dirs(e["command"])]
    compiler = e["command"].split()[0]
    homes = header_homes()
    own = next(h for h, home in homes.items() if home == layer and h.endswith(".hpp"))
    above = {home: h for h, home in sorted(homes.items()) if home != layer and home not in EXPECTED[layer]}
    assert above, "a layer with nothing above it needs no check"

    def compiles(header):
        src = tmp_path / "probe.cpp"
        src.write_text(f'#include "{header}"\n')
        r = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", *flags, str(src)], capture_output=True, text=True,
                           cwd=e["directory"], timeout=100)
        return r.returncode == 0, r.stderr

    ok, err = compiles(own)
    assert ok, err
    for home, header in above.items():
        ok, err = compiles(header)
        assert not ok and "No such file" in err, f"runtime/{layer} could include {header} of runtime/{home}"
