"""Resolve pytest node ids named in ``Tests:`` trailers without importing anything."""

import ast
from pathlib import Path, PurePosixPath


def _defines(body, name):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def invalid_test_id(node_id: str):
    """Why ``node_id`` is not a safe pytest argument (a relative path inside tests/), else None.

    Tests: ids reach pytest's command line: ``-p plugin`` or ``--rootdir=/`` would be options,
    and an absolute or ``../`` path would run code from outside the checkout.
    """
    path = node_id.split("::", 1)[0]
    if node_id.startswith("-"):
        return "starts with '-' (it would be read as a pytest option)"
    if any(ord(c) < 32 for c in node_id) or "\\" in path:
        return "contains a control character or a backslash"
    parts = PurePosixPath(path).parts
    if PurePosixPath(path).is_absolute() or ".." in parts or not parts or parts[0] != "tests" \
            or len(parts) < 2:
        return "must be a relative path inside tests/ (no absolute path, no '..')"
    return None


def missing_test(root: Path, node_id: str):
    """Return why ``node_id`` does not name an existing test, or None if it does."""
    invalid = invalid_test_id(node_id)
    if invalid:
        return invalid
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
