"""The tool's layout rules (tools/rebase/README.md): imports only go down the layers, no module
imports itself back through a cycle, modules and classes stay small unless their docstring says
why, and setup.py installs every package of the tool."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "rebase"

# Bottom to top; a module may import its own layer and the ones before it. The top-level modules:
# errors.py is the base every layer raises from, cli.py/launch.py/__main__.py the entry.
LAYERS = ["base", "git", "stack", "proof", "analysis", "report", "bump", "commands", "entry"]
TOP_LEVEL = {"tools.rebase": "base", "tools.rebase.errors": "base", "tools.rebase.cli": "entry",
             "tools.rebase.launch": "entry", "tools.rebase.__main__": "entry"}
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
SIZE_REASON = "Size:"  # a docstring paragraph that says why this one is larger


def module_name(path: Path, tool: Path = TOOL) -> str:
    parts = path.relative_to(tool.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tool_modules(tool: Path = TOOL) -> dict:
    """``{dotted name: path}`` of every module of the tool."""
    return {module_name(p, tool): p for p in sorted(tool.rglob("*.py")) if "__pycache__" not in p.parts}


def layer_of(name: str, tool: Path = TOOL) -> str:
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    parts = name.split(".")
    if len(parts) < 3 or parts[:2] != ["tools", "rebase"]:
        raise ValueError(f"{name} is not a module of the tool")
    if len(parts) == 3 and (tool / f"{parts[2]}.py").is_file():
        raise ValueError(f"{name}: a top-level module of tools/rebase needs a layer (TOP_LEVEL in {__file__})")
    if parts[2] not in LAYERS:
        raise ValueError(f"{name}: package tools/rebase/{parts[2]}/ is in no layer: add it to LAYERS in "
                         f"{__file__} and to tools/rebase/README.md")
    return parts[2]


def imports_of(name: str, path: Path, known) -> set:
    """The tool's modules that ``name`` imports, lazy (inside functions) imports included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod when there is one
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import tools.rebase.x.y` -> the module that exists
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("tools.rebase"):
                found.add(target)
    return found


def import_graph(tool: Path = TOOL) -> dict:
    modules = tool_modules(tool)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def upward_imports(graph: dict, tool: Path = TOOL) -> list:
    rank = {layer: k for k, layer in enumerate(LAYERS)}
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target == "tools.rebase" or name.startswith(target + "."):
                continue  # a package's own __init__ runs first anyway
            if rank[layer_of(target, tool)] > rank[layer_of(name, tool)]:
                out.append(f"{name} ({layer_of(name, tool)}) imports {target} ({layer_of(target, tool)})")
    return out


def cycles(graph: dict) -> list:
    """One cycle per strongly connected group of modules (Tarjan), each as a list of names."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def oversized(tool: Path = TOOL) -> list:
    out = []
    for name, path in tool_modules(tool).items():
        text = path.read_text()
        tree = ast.parse(text, str(path))
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES and SIZE_REASON not in (ast.get_docstring(tree) or ""):
            out.append(f"{path.relative_to(tool.parents[1])}: {lines} lines (over {MAX_MODULE_LINES}: split it, "
                       f"or say why in a {SIZE_REASON!r} paragraph of its docstring)")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES and SIZE_REASON not in (ast.get_docstring(node) or ""):
                    out.append(f"{path.relative_to(tool.parents[1])}: class {node.name} has {size} lines "
                               f"(over {MAX_CLASS_LINES}: split it, or say why in its docstring)")
    return out


# ---------------------------------------------------------------- the rules, on the tool itself

def test_imports_only_go_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_modules_and_classes_are_small_or_say_why():
    assert oversized() == []


def test_every_package_of_the_tool_has_a_layer_and_the_readme_names_it():
    readme = (TOOL / "README.md").read_text()
    packages = sorted(p.parent.name for p in TOOL.glob("*/__init__.py"))
    assert packages and set(packages) <= set(LAYERS)
    for layer in packages:
        assert f"`{layer}/`" in readme, f"tools/rebase/README.md does not describe {layer}/"


def _setup_call():
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")


def test_setup_installs_every_package_and_data_file_of_the_tool():
    """setup.py installs tools/rebase as megatron_rebase: find_packages over tools/rebase (so every
    folder of modules needs an __init__.py) and TOOL_DATA for its other files. The wheel test
    (test_sdist_installs_offline.py) checks what a built wheel holds."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    kw = {k.arg: k.value for k in _setup_call().keywords}
    assert "find_packages(str(ROOT / 'tools' / 'rebase'))" in ast.unparse(kw["packages"])
    assert ast.unparse(kw["package_dir"]) == "{TOOL: 'tools/rebase'}"
    for folder in {p.parent for p in TOOL.rglob("*.py") if "__pycache__" not in p.parts}:
        assert (folder / "__init__.py").is_file(), f"{folder} has modules but no __init__.py: it would not be installed"
    assigned = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)
                and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    data_files = ast.literal_eval(assigned["TOOL_DATA"])
    for data in (p for p in TOOL.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc", ".md")):
        sub = data.parent.relative_to(TOOL).as_posix()
        assert data.name in data_files.get(sub, []), f"setup.py's TOOL_DATA does not ship {data}"


# ---------------------------------------------------------------- the checker catches what it should

def _tool(tmp_path, files: dict) -> Path:
    tool = tmp_path / "tools" / "rebase"
    for rel, text in {"__init__.py": "", "errors.py": "", "git/__init__.py": "", "bump/__init__.py": "",
                      **files}.items():
        (tool / rel).parent.mkdir(parents=True, exist_ok=True)
        (tool / rel).write_text(text)
    return tool


def _graph(tool):
    return import_graph(tool)


def test_checker_flags_an_upward_import_even_a_lazy_one(tmp_path):
    tool = _tool(tmp_path, {
        "git/low.py": "def f():\n    from tools.rebase.bump import high\n",
        "bump/high.py": "from tools.rebase.git.low import f\nfrom tools.rebase.errors import RebaseError\n",
    })
    assert upward_imports(_graph(tool), tool) == ["tools.rebase.git.low (git) imports tools.rebase.bump.high (bump)"]


def test_checker_flags_a_cycle_inside_one_layer(tmp_path):
    tool = _tool(tmp_path, {
        "git/a.py": "from tools.rebase.git import b\n",
        "git/b.py": "from . import c\n",
        "git/c.py": "import tools.rebase.git.a\n",
    })
    graph = _graph(tool)
    assert upward_imports(graph, tool) == []
    assert cycles(graph) == [["tools.rebase.git.a", "tools.rebase.git.b", "tools.rebase.git.c"]]


def test_checker_flags_a_package_in_no_layer(tmp_path):
    tool = _tool(tmp_path, {"extras/__init__.py": "", "extras/x.py": "from tools.rebase.git import low\n",
                            "git/low.py": ""})
    with pytest.raises(ValueError, match="extras/ is in no layer"):
        upward_imports(_graph(tool), tool)


def test_checker_flags_a_long_module_and_a_long_class_unless_they_say_why(tmp_path):
    long_class = "class Big:\n    \"\"\"Doc.\"\"\"\n" + "    x = 1\n" * MAX_CLASS_LINES
    tool = _tool(tmp_path, {
        "git/long.py": '"""Doc."""\n' + "x = 1\n" * MAX_MODULE_LINES,
        "git/excused.py": '"""Doc.\n\nSize: one table of cases, split would scatter it."""\n' + "x = 1\n" * MAX_MODULE_LINES,
        "git/klass.py": long_class,
    })
    found = oversized(tool)
    assert len(found) == 2
    assert found[0].startswith("tools/rebase/git/klass.py: class Big has 252 lines")
    assert found[1].startswith(f"tools/rebase/git/long.py: {MAX_MODULE_LINES + 1} lines")
