"""The design of record (docs/architecture/) and the tests that hold its invariants, checked in
both directions: each invariant names tests that exist and claim it (a Catch2 tag `[inv:ID]`, a
pytest docstring `Invariant ID`), and each test that claims an invariant is named by it. Also:
the book's pages are all linked from its index, and its links lead to files that exist."""
import ast
import os
import re

SOURCE = os.environ.get("XMESH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BOOK = os.path.join(SOURCE, "docs", "architecture")
INVARIANT = re.compile(r"^\*\*([a-z]+)\.(\d+)\. (.+?)\*\*", re.M)
HELD_CPP = re.compile(r'^- `(tests/[\w/]+\.cpp)` "(.+)"$')
HELD_PY = re.compile(r"^- `(tests/[\w/]+\.py)::(\w+)`$")
CPP_TEST = re.compile(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"\s*,\s*"([^"]*)"')
CPP_CLAIM = re.compile(r"\[inv:([a-z]+\.\d+)\]")
PY_CLAIM = re.compile(r"Invariant ([a-z]+\.\d+) \(docs/architecture/([\w.-]+)\)")


def pages() -> list:
    return sorted(f for f in os.listdir(BOOK) if f.endswith(".md") and f != "README.md")


def invariants() -> dict:
    """ID -> (page, title, [(kind, file, test name)]) as the book lists them."""
    found = {}
    for page in pages():
        text = open(os.path.join(BOOK, page)).read()
        marks = list(INVARIANT.finditer(text))
        for i, m in enumerate(marks):
            iid = f"{m.group(1)}.{m.group(2)}"
            assert iid not in found, f"{iid} is defined twice ({found.get(iid, ('?',))[0]} and {page})"
            block = text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
            held = []
            for line in block.splitlines():
                if c := HELD_CPP.match(line.strip()):
                    held.append(("cpp", c.group(1), c.group(2)))
                elif p := HELD_PY.match(line.strip()):
                    held.append(("py", p.group(1), p.group(2)))
            found[iid] = (page, m.group(3), held)
    return found


def cpp_tests() -> dict:
    """(file, test name) -> the invariant IDs its tags claim, for every Catch2 test."""
    tests = {}
    folder = os.path.join(SOURCE, "tests", "cpp")
    for f in sorted(os.listdir(folder)):
        if f.endswith(".cpp"):
            for m in CPP_TEST.finditer(open(os.path.join(folder, f)).read()):
                tests[(f"tests/cpp/{f}", m.group(1).replace('\\"', '"'))] = set(CPP_CLAIM.findall(m.group(2)))
    return tests


def py_tests() -> dict:
    """(file, test function) -> {invariant ID: the page its docstring names}, for every pytest test."""
    tests = {}
    for sub in ("python", "kernel", "browser", "wheel"):
        folder = os.path.join(SOURCE, "tests", sub)
        if not os.path.isdir(folder):
            continue
        for f in sorted(os.listdir(folder)):
            if not (f.startswith("test_") and f.endswith(".py")):
                continue
            tree = ast.parse(open(os.path.join(folder, f)).read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                    doc = ast.get_docstring(node) or ""
                    tests[(f"tests/{sub}/{f}", node.name)] = dict(PY_CLAIM.findall(doc))
    return tests


def test_invariants_are_numbered_in_order_on_each_page():
    """Each page's invariants are <prefix>.1, .2, ... in order, one prefix per page."""
    for page in pages():
        marks = INVARIANT.findall(open(os.path.join(BOOK, page)).read())
        if not marks:
            continue
        prefixes = {p for p, _, _ in marks}
        assert len(prefixes) == 1, f"{page} numbers its invariants under several names: {sorted(prefixes)}"
        assert [int(n) for _, n, _ in marks] == list(range(1, len(marks) + 1)), f"{page}: {marks}"


def test_every_invariant_names_tests_that_exist_and_claim_it():
    cpp, py = cpp_tests(), py_tests()
    problems = []
    for iid, (page, title, held) in invariants().items():
        if not held:
            problems.append(f"{iid} ({title}) names no test")
        for kind, f, name in held:
            claims = cpp.get((f, name)) if kind == "cpp" else py.get((f, name))
            if claims is None:
                problems.append(f"{iid} names {f} {name!r}, which does not exist")
            elif iid not in claims:
                problems.append(f"{iid} names {f} {name!r}, which does not say it holds {iid}")
            elif kind == "py" and claims[iid] != page:
                problems.append(f"{f}::{name} places {iid} on {claims[iid]}, the book on {page}")
    assert problems == []


def test_every_test_that_claims_an_invariant_is_named_by_it():
    book = invariants()
    problems = []
    for kind, tests in (("cpp", cpp_tests()), ("py", py_tests())):
        for (f, name), claims in tests.items():
            for iid in claims:
                if iid not in book:
                    problems.append(f"{f} {name!r} claims {iid}, which the book does not define")
                elif (kind, f, name) not in book[iid][2]:
                    problems.append(f"{f} {name!r} claims {iid}, which does not name it")
    assert problems == []


def test_the_index_links_every_page_and_every_link_resolves():
    index = open(os.path.join(BOOK, "README.md")).read()
    unlinked = [p for p in pages() if f"]({p})" not in index]
    assert unlinked == [], f"pages the index does not link: {unlinked}"
    broken = []
    for page in ["README.md"] + pages():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", open(os.path.join(BOOK, page)).read()):
            if "://" not in target and not os.path.exists(os.path.join(BOOK, target)):
                broken.append(f"{page} -> {target}")
    assert broken == []


def test_a_claim_the_book_does_not_make_is_caught(tmp_path, monkeypatch):
    """The checks can fail: a page with an invariant naming a test that does not claim it, and a
    gap in the numbering, are both reported."""
    book = tmp_path / "docs" / "architecture"
    book.mkdir(parents=True)
    (book / "README.md").write_text("[x](01-x.md)\n")
    (book / "01-x.md").write_text(
        "# x\n\n**x.1. First.** text\nHeld by:\n- `tests/python/test_architecture_book.py::test_invariants_are_numbered_in_order_on_each_page`\n\n"
        "**x.3. Third.** text\n")
    monkeypatch.setattr(__import__(__name__), "BOOK", str(book))
    found = invariants()
    assert set(found) == {"x.1", "x.3"}
    py = py_tests()
    claims = py[("tests/python/test_architecture_book.py", "test_invariants_are_numbered_in_order_on_each_page")]
    assert "x.1" not in claims  # so the first check would report it
    try:
        test_invariants_are_numbered_in_order_on_each_page()
    except AssertionError as e:
        assert "01-x.md" in str(e)
    else:
        raise AssertionError("a gap in the numbering went unnoticed")
