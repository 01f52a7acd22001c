"""Deterministic mutants of the lines a patch adds, for ``prove --mutants``.

``prove`` shows a patch is needed; a mutant that its ``Tests:`` do not kill shows a line they do
not pin. Mutants are made on single added Python lines, token by token (strings and comments are
never touched): flipped comparisons, ``and``/``or`` swapped, ``not`` dropped, constants changed,
a statement deleted (replaced by ``pass``), ``.detach()`` dropped. :func:`sample` picks ``count``
of them with a seeded generator, so a run is reproducible. Pure: no files, no processes.

A survivor that cannot be killed (the mutated line means the same) is marked equivalent in
``patches/mutants-equivalent.toml``, by its id, with a reason (:func:`load_equivalents`).
"""

import hashlib
import io
import random
import re
import tokenize
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_FILE = re.compile(r"^\+\+\+ b/(\S+)")
_COMPARE = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_BOOL = {"and": "or", "or": "and", "True": "False", "False": "True"}
_BLOCK_START = re.compile(r"^\s*(?:if|elif|else|for|while|try|except|finally|with|def|class|async|@|return\s*$)")


@dataclass(frozen=True)
class Mutant:
    path: str  # file in the patched tree
    line: int  # 1-based line number in the patched file
    original: str  # the added line, without its newline
    mutated: str
    operator: str

    @property
    def id(self) -> str:
        """Stable across re-exports: depends on the file and the two lines, not the number."""
        text = "\0".join((self.path, self.original.strip(), self.mutated.strip(), self.operator))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def added_lines(patch_text: str) -> list:
    """``(path, new line number, text)`` for every line a unified diff adds to a ``.py`` file."""
    out, path, number = [], None, None
    for raw in patch_text.splitlines():
        m = _FILE.match(raw)
        if m:
            path = m[1] if m[1].endswith(".py") else None
            number = None
            continue
        m = _HUNK.match(raw)
        if m:
            number = int(m[1])
            continue
        if path is None or number is None or raw.startswith(("--- ", "diff --git", "\\")):
            continue
        if raw.startswith("+"):
            out.append((path, number, raw[1:]))
            number += 1
        elif raw.startswith(" "):
            number += 1
    return out


def _tokens(line: str) -> list:
    """The tokens of one physical line (an unfinished bracket is fine: what came before it)."""
    toks = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            if tok.start[0] == 1:
                toks.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return toks


def _replace(line: str, tok, text: str) -> str:
    return line[: tok.start[1]] + text + line[tok.end[1]:]


def _is_code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith(("#", '"', "'"))


def mutants_of_line(path: str, number: int, line: str) -> list:
    """Every mutant of one added line, in a fixed order."""
    if not _is_code(line):
        return []
    out = []

    def add(mutated, operator):
        if mutated != line:
            out.append(Mutant(path, number, line, mutated, operator))

    toks = _tokens(line)
    for i, tok in enumerate(toks):
        if tok.type == tokenize.OP and tok.string in _COMPARE:
            add(_replace(line, tok, _COMPARE[tok.string]), "flip comparison")
        elif tok.type == tokenize.NAME and tok.string in ("and", "or"):
            add(_replace(line, tok, _BOOL[tok.string]), "and/or")
        elif tok.type == tokenize.NAME and tok.string in ("True", "False"):
            add(_replace(line, tok, _BOOL[tok.string]), "change constant")
        elif tok.type == tokenize.NAME and tok.string == "not":
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            prev = toks[i - 1] if i else None
            if prev is not None and prev.string == "is":  # "is not" -> "is"
                add(line[: prev.end[1]] + line[tok.end[1]:], "drop not")
            elif nxt is not None:  # "not x" -> "x", "not in" -> "in"
                add(line[: tok.start[1]] + line[nxt.start[1]:], "drop not")
        elif tok.type == tokenize.NUMBER and re.fullmatch(r"\d+", tok.string):
            add(_replace(line, tok, str(int(tok.string) + 1)), "change constant")
        elif tok.type == tokenize.NAME and tok.string == "detach":
            if (i >= 1 and toks[i - 1].string == "." and i + 2 < len(toks)
                    and toks[i + 1].string == "(" and toks[i + 2].string == ")"):
                add(line[: toks[i - 1].start[1]] + line[toks[i + 2].end[1]:], "drop detach")
    if _deletable(line, toks):
        indent = line[: len(line) - len(line.lstrip())]
        add(indent + "pass", "delete statement")
    return out


def _deletable(line: str, toks: list) -> bool:
    """A whole simple statement on one line (brackets balanced, no block header)."""
    stripped = line.strip()
    if _BLOCK_START.match(line) or stripped.endswith((":", ",", "\\", "(", "[", "{")):
        return False
    if stripped.startswith((")", "]", "}", "pass")):
        return False
    depth = 0
    for tok in toks:
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def mutants_of_patch(patch_text: str, prefix: str = "megatron/") -> list:
    """All mutants of the lines a patch adds to Python files under ``prefix``."""
    out = []
    for path, number, line in added_lines(patch_text):
        if path.startswith(prefix):
            out.extend(mutants_of_line(path, number, line))
    return out


_NOT_CODE = {tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
             tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
_NOT_CODE |= {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
              if hasattr(tokenize, n)}


def code_lines(text: str):
    """Line numbers of ``text`` that hold code (not only a docstring, string or comment), or
    None when the file does not tokenize. A line inside a multi-line docstring looks like code
    on its own; prove keeps only mutants of these lines."""
    lines = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in _NOT_CODE:
                lines.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return lines


def in_code(mutants: list, path_text: dict) -> list:
    """The mutants whose line is code in its file (``path_text``: path -> patched file text)."""
    keep = []
    cache = {}
    for m in mutants:
        if m.path not in cache:
            cache[m.path] = code_lines(path_text[m.path]) if m.path in path_text else None
        lines = cache[m.path]
        if lines is None or m.line in lines:
            keep.append(m)
    return keep


def sample(mutants: list, count: int, seed: int = 0) -> list:
    """``count`` mutants chosen with ``random.Random(seed)``, in patch order; all if fewer."""
    if count < 0:
        raise ValueError(f"mutant count must be >= 0, got {count}")
    if count >= len(mutants):
        return list(mutants)
    chosen = set(random.Random(seed).sample(range(len(mutants)), count))
    return [m for i, m in enumerate(mutants) if i in chosen]


def sample_where(mutants: list, count: int, seed: int, keep) -> tuple:
    """``(sample, rejected)``: ``count`` mutants for which ``keep(mutant)`` holds, taken in a
    ``random.Random(seed)`` order and returned in patch order, and how many were tried and
    rejected on the way. Only as many are tried as the sample needs (``keep`` may be costly)."""
    if count < 0:
        raise ValueError(f"mutant count must be >= 0, got {count}")
    order = random.Random(seed).sample(range(len(mutants)), len(mutants))
    chosen, rejected = [], 0
    for i in order:
        if len(chosen) == count:
            break
        if keep(mutants[i]):
            chosen.append(i)
        else:
            rejected += 1
    return [mutants[i] for i in sorted(chosen)], rejected


def apply_mutant(text: str, mutant: Mutant) -> str:
    """``text`` (the patched file) with the mutant's line replaced; refuses a stale mutant."""
    lines = text.split("\n")
    if not 0 < mutant.line <= len(lines) or lines[mutant.line - 1] != mutant.original:
        raise ValueError(
            f"mutant {mutant.id}: line {mutant.line} of {mutant.path} is not "
            f"{mutant.original.strip()!r}"
        )
    lines[mutant.line - 1] = mutant.mutated
    return "\n".join(lines)


def load_equivalents(text: str, where: str = "patches/mutants-equivalent.toml") -> dict:
    """``{mutant id: reason}`` from the sidecar; every entry needs an id and a non-empty reason."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid TOML: nested too deeply") from None
    out = {}
    for index, entry in enumerate(data.get("equivalent", [])):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: equivalent[{index}] must be a table")
        mid, reason = entry.get("id"), entry.get("reason")
        if not (isinstance(mid, str) and re.fullmatch(r"[0-9a-f]{12}", mid)):
            raise ValueError(f"{where}: equivalent[{index}]: id must be a 12-digit hex mutant id")
        if not (isinstance(reason, str) and reason.strip()):
            raise ValueError(f"{where}: equivalent[{index}] ({mid}): a reason is required")
        out[mid] = reason.strip()
    return out


def score(killed: int, survived: int) -> float:
    """Killed share of the non-equivalent mutants (``survived`` counts none marked equivalent;
    1.0 when there are none)."""
    total = killed + survived
    return 1.0 if total == 0 else killed / total
