"""Issue 46, item 3: every file the tool writes goes through ``tools/rebase/git/safefs.py`` (no
link followed, temporaries with random names, replaced by rename). This walks the package's source
for any other write and names it; a new write must use ``safefs`` or be listed here with why."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tools" / "rebase"
WRITER = PACKAGE / "git" / "safefs.py"
# module -> why it may write without safefs
EXEMPT = {
    "proof/prove_report.py": "the pytest plugin prove copies into its private run folder; it runs inside "
                             "pytest, imports nothing of the tool, and writes the report file prove named "
                             "in its own temporary folder",
}
METHODS = {"write_text", "write_bytes", "touch", "extractall", "extract"}
ARCHIVES = {"tarfile", "zipfile", "gzip", "bz2", "lzma"}
SHUTIL = {"copy", "copy2", "copyfile", "copytree", "move", "copyfileobj"}
TEMPFILE = {"mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"}
WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_APPEND", "O_TRUNC"}


def _mode(call: ast.Call, position: int):
    args = [a for a in call.args[position:position + 1]] + [k.value for k in call.keywords if k.arg == "mode"]
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return "?"  # a computed mode: counted as a write
    return "r"


def writes(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
        if isinstance(fn, ast.Attribute) and name in METHODS:
            yield node.lineno, f".{name}()"
        elif owner == "shutil" and name in SHUTIL or owner == "tempfile" and name in TEMPFILE:
            yield node.lineno, f"{owner}.{name}()"
        elif owner == "os" and name in ("mkfifo", "mknod"):
            yield node.lineno, f"os.{name}()"
        elif owner == "os" and name == "open":
            flags = {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)} if len(node.args) > 1 else set()
            if flags & WRITE_FLAGS or not flags:
                yield node.lineno, "os.open() for writing"
        elif owner == "os" and name == "fdopen" and set(_mode(node, 1)) & set("wax+?"):
            yield node.lineno, "os.fdopen() for writing"
        elif owner in ARCHIVES and name == "open":
            mode = next((k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)),
                        node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "r")
            if set(str(mode)) & set("wax+"):
                yield node.lineno, f"{owner}.open() for writing"
        elif name == "open" and (owner == "" or isinstance(fn, ast.Attribute)) and owner != "os":
            position = 1 if isinstance(fn, ast.Name) else 0
            if set(_mode(node, position)) & set("wax+?"):
                yield node.lineno, "open() for writing"


def test_every_write_of_the_tool_goes_through_safefs():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path == WRITER or rel in EXEMPT:
            continue
        for line, what in writes(ast.parse(path.read_text(), str(path))):
            found.append(f"tools/rebase/{rel}:{line}: {what}")
    assert not found, "writes outside tools/rebase/git/safefs.py:\n" + "\n".join(found)


def test_the_walker_sees_each_kind_of_write():
    source = ("p.write_text('x')\nopen(p, 'w')\nos.open(p, os.O_WRONLY | os.O_CREAT)\nshutil.copy2(a, b)\n"
              "tempfile.mkstemp()\nos.fdopen(fd, 'wb')\np.open('a')\ntar.extractall(d)\ntarfile.open(p, 'w')\n"
              "open(p)\nos.open(p, os.O_RDONLY)\ntarfile.open(p)\ntarfile.open(fileobj=f, mode='r:*')\n")
    assert [line for line, _ in writes(ast.parse(source))] == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_the_exempt_modules_exist():
    assert all((PACKAGE / rel).is_file() for rel in EXEMPT)
