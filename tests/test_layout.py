"""The package as it is imported: an import path names the file that holds
it, in a plain checkout as in the installed package; no module imports
itself back through others, and no folder imports a folder that imports it
back; no function runs over a screen."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

from helpers import REPO

PACKAGES = ("ringtrain", "ps_baseline")
MAX_FUNCTION_LINES = 60


def modules():
    """{import name: path} of every module of the two packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted(pathlib.Path(REPO, package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(node):
    """What an import statement may import, by absolute name (`from a import b`: a and a.b); else nothing."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    return set()


def imports_of(name, path, known):
    """The project's modules that `name` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        out |= imported(node) & set(known)
    return out - {name}


def import_graph():
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def folder_of(name, known):
    path = known[name]
    return str(path.parent.relative_to(REPO))


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_no_folder_imports_a_folder_that_imports_it_back():
    known, graph = modules(), import_graph()
    folders = {}
    for name, targets in graph.items():
        for target in targets:
            a, b = folder_of(name, known), folder_of(target, known)
            if a != b:
                folders.setdefault(a, set()).add(b)
    assert cycles(folders) == [], folders


def test_a_plain_checkout_imports_every_module_from_the_file_its_name_names():
    """Without the installed package's import hook (python -S: no site-packages),
    with only the checkout on the path."""
    known = modules()
    script = ("import importlib.util, json, sys; sys.path[:0] = [sys.argv[1]]; "
              "print(json.dumps({n: importlib.util.find_spec(n).origin for n in sys.argv[2:]}))")
    done = subprocess.run([sys.executable, "-S", "-c", script, REPO, *known], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    import json
    origins = json.loads(done.stdout)
    assert {n: os.path.realpath(o) for n, o in origins.items()} == {n: os.path.realpath(p) for n, p in known.items()}


def test_the_installed_package_imports_the_same_files():
    import importlib.util
    for name, path in modules().items():
        assert os.path.realpath(importlib.util.find_spec(name).origin) == os.path.realpath(path), name


def top_level_imports(path):
    """Modules a file imports as it is imported: its body's statements, and those of
    its top-level if, try and with blocks, not a function's, a class's or a script's
    `if __name__ == "__main__":`."""
    found, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        found |= imported(node)
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return found


def test_no_module_starts_mpi_as_it_is_imported():
    """`from mpi4py import MPI` is MPI_Init: a process that imports such a module for
    anything else (a test's pytest worker) becomes a singleton MPI job, with an orted
    of its own, a folder in OpenMPI's /tmp session tree, and OpenMPI's variables in the
    environment of every child it starts. mpi4py is imported where it is used."""
    starts = [name for name, path in modules().items() if "mpi4py.MPI" in top_level_imports(path)]
    assert starts == []
    done = subprocess.run([sys.executable, "-c", "import sys; from ringtrain.bench import ring_reference; "
                           "print('mpi4py.MPI' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr[-2000:]


def python_files():
    for folder in (*PACKAGES, "tests", "examples"):
        yield from sorted(pathlib.Path(REPO, folder).rglob("*.py"))


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_no_undefined_name_or_unused_import():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.fail("ruff is not installed: make install installs the test extras")
    done = subprocess.run([ruff, "check", "--select", "F", "--no-cache", "--quiet", *PACKAGES, "tests", "examples"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
