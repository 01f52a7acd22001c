"""Does the new base still hold what a line relies on? Its premise (``stack/premise.py``) and the
reasons of its recorded drops (``stack/drops.py``), checked statically (``basesymbols``).

A drop's reason is free text; what it names is checked where it can be: a token that abbreviates
a commit of the work repo (hex, 7 to 40 digits) that the old base contains must be in the new base
too; a token that looks like a code name (``snake_case`` with an underscore, ``CamelCase`` with two
capitals, or ``Class.member``) that the old base defines must still be defined. Tokens the old base
does not know (a PR number, a product name) are not claims about the base and are left alone.
"""

import re

from tools.rebase.analysis.basesymbols import defined_in_tree, definitions, defines, file_text, is_ancestor, \
    resolve_commit

_HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def _looks_like_code(name: str) -> bool:
    if "_" in name.strip("_"):
        return True
    return sum(c.isupper() for c in name) >= 2 and any(c.islower() for c in name)


def reason_claims(reason: str) -> tuple:
    """``(commit-like tokens, code names)`` a drop reason mentions (code names: the last part of a
    dotted name; file names such as ``x.py`` are not names)."""
    commits = [t for t in _HEX.findall(reason) if any(c.isdigit() for c in t) and any(c.isalpha() for c in t)]
    names = []
    for token in _TOKEN.findall(reason):
        parts = token.split(".")
        if parts[-1] == "py" or token in commits:
            continue
        last = parts[-1]
        if _looks_like_code(last) and last not in names:
            names.append(last)
    return commits, names


def premise_problems(work, new_base: str, symbols) -> list:
    """One line per premise symbol the new base lacks (its file gone, or the name not defined there)."""
    problems, parsed = [], {}
    for s in symbols:
        if s.path not in parsed:
            text = file_text(work, new_base, s.path)
            parsed[s.path] = None if text is None else definitions(text)
        defs = parsed[s.path]
        why = f" ({s.why})" if s.why else ""
        if defs is None:
            problems.append(f"premise: {s.path} is not in the new base, so {s.name} is gone{why}")
        elif not defines(defs, s.name):
            problems.append(f"premise: {s.path} no longer defines {s.name}{why}")
    return problems


def drop_problems(work, old_base: str, new_base: str, drops: dict, history=None) -> list:
    """One line per drop whose reason names an upstream commit or code name the old base has and
    the new base does not. ``history``: the (old, new) upstream commits the bases were made from
    (None for an sdist base: no commit is checked)."""
    claims = {name: reason_claims(reason) for name, reason in drops.items()}
    names = {n for _, ns in claims.values() for n in ns}
    in_old = defined_in_tree(work, old_base, names)
    in_new = defined_in_tree(work, new_base, in_old)
    problems = []
    for patch, (commits, code) in claims.items():
        for token in commits if history else []:
            full = resolve_commit(work, token)
            if full and is_ancestor(work, full, history[0]) and not is_ancestor(work, full, history[1]):
                problems.append(f"dropped {patch}: its reason cites upstream commit {token}, which the new "
                                f"base does not contain")
        gone = [n for n in code if n in in_old and n not in in_new]
        if gone:
            problems.append(f"dropped {patch}: its reason names {', '.join(gone)}, which the new base no "
                            f"longer defines")
    return problems
