"""Functions stay short enough to read in one screen: no C function in src/
(or fuzz/) longer than C_MAX lines, no Python function in exreplay/ longer
than PY_MAX (docstring included). A function that grows past the limit is
split into named steps, each doing one job (docs/design.md, "File map")."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_MAX = 60
PY_MAX = 80


def _files(sub, ext):
    out = []
    for d, _, names in os.walk(os.path.join(ROOT, sub)):
        out += [os.path.join(d, n) for n in names if n.endswith(ext)]
    return sorted(out)


def c_function_lengths(path):
    """(name, lines) of each function definition in a C file written in the
    project's style: the body's braces in column 0, the name on the line
    with the parameter list's opening parenthesis (signature included)."""
    lines = open(path).read().split("\n")
    out, i = [], 1
    while i < len(lines):
        if lines[i].startswith("{"):
            j = i - 1
            while j > 0 and "(" not in lines[j]:
                j -= 1
            m = re.search(r"(\w+)\s*\(", lines[j])
            k = i + 1
            while k < len(lines) and not lines[k].startswith("}"):
                k += 1
            out.append((m.group(1) if m else "?", k - j + 1))
            i = k
        i += 1
    return out


def py_function_lengths(path):
    tree = ast.parse(open(path).read())
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_scanner_finds_functions(tmp_path):
    c = tmp_path / "f.c"
    c.write_text("static int\nadd(int a,\n    int b)\n{\n    return a + b;\n}\n\n"
                 "void g(void)\n{\n}\n")
    assert c_function_lengths(str(c)) == [("add", 5), ("g", 3)]
    p = tmp_path / "f.py"
    p.write_text('def f():\n    """doc"""\n    return 1\n\n\nclass C:\n    def m(self):\n'
                 "        pass\n")
    assert sorted(py_function_lengths(str(p))) == [("f", 3), ("m", 2)]


@pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "src")), reason="no sources here")
def test_c_functions_are_short():
    long = [(os.path.relpath(f, ROOT), name, n)
            for f in _files("src", ".c") + _files("fuzz", ".c")
            for name, n in c_function_lengths(f) if n > C_MAX]
    assert not long, "C functions longer than %d lines: %s" % (C_MAX, long)


@pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "exreplay")), reason="no package here")
def test_python_functions_are_short():
    long = [(os.path.relpath(f, ROOT), name, n)
            for f in _files("exreplay", ".py")
            for name, n in py_function_lengths(f) if n > PY_MAX]
    assert not long, "Python functions longer than %d lines: %s" % (PY_MAX, long)
