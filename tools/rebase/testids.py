"""Resolve pytest node ids named in ``Tests:`` trailers without importing anything."""

import ast
from pathlib import Path


def _defines(body, name):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def missing_test(root: Path, node_id: str):
    """Return why ``node_id`` does not name an existing test, or None if it does."""
    path, *parts = node_id.split("::")
    file = root / path
    if not file.exists():
        return f"{path} does not exist"
    if file.is_dir() or not parts:
        return None
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as exc:
        return f"{path} does not parse: {exc}"
    body = tree.body
    for i, part in enumerate(parts):
        name = part.split("[", 1)[0]
        node = _defines(body, name)
        if node is None:
            return f"{path} has no {'::'.join([*parts[:i], name])}"
        body = getattr(node, "body", [])
    return None
