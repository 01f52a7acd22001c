"""docs/security.md is the reference of the security model (issue 46): every environment variable
the tool and setup.py read, and every file of a checkout setup.py refuses or keeps out of a build,
is listed there, and each test file it cites exists."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def _variables():
    """Names of the FORK_* / MEGATRON_* variables as string constants in the tool and setup.py."""
    found = set()
    for path in [ROOT / "setup.py", *sorted((ROOT / "tools" / "rebase").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= set(re.findall(r"\b(?:FORK|MEGATRON)_[A-Z_]+\b", node.value))
    return found - {"FORK_REBASE_"}


def test_every_environment_variable_read_is_listed():
    text = DOC.read_text()
    variables = _variables()
    assert {"FORK_REBASE_CACHE", "MEGATRON_FORK_SKIP_APPLY", "FORK_REBASE_ALLOW_PACKAGE"} <= variables
    missing = sorted(v for v in variables if f"`{v}`" not in text)
    assert not missing, f"docs/security.md does not list {missing}"


def test_every_build_input_setup_py_guards_is_listed():
    from tools.rebase.git.paths import BUILD_OUTPUT

    text = DOC.read_text()
    setup = ast.parse((ROOT / "setup.py").read_text())
    inputs = next(ast.literal_eval(n.value) for n in setup.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "SETUPTOOLS_INPUTS")
    names = list(inputs) + [p.split(")")[-1].split("/")[0] for p in BUILD_OUTPUT]
    assert names == ["setup.cfg", "MANIFEST.in", "build", "dist", "*.egg-info"]
    missing = [n for n in names if f"`{n}" not in text]
    assert not missing, f"docs/security.md does not list {missing}"


def test_every_test_file_the_doc_cites_exists():
    cited = set(re.findall(r"`((?:[a-z]+/)?test_[a-z0-9_*]+\.py)`", DOC.read_text()))
    assert len(cited) > 10
    missing = sorted(c for c in cited if "*" not in c and not (ROOT / "tests" / "tools" / c).is_file())
    assert not missing, f"docs/security.md cites missing tests: {missing}"
