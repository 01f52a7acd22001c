"""``check``: added lines of a patch must hold no bidirectional or invisible Unicode control.

Such a character makes a line display differently from what Python reads ("Trojan Source",
CVE-2021-42574): an override (U+202E) reorders what a reviewer sees, a zero-width space hides in
an identifier, a line separator ends a line for an editor and not for the interpreter. git and
GitHub flag them in a diff; ``check`` names each one by patch, file and line.
"""

import unicodedata

from tools.rebase.git.safefs import read_nofollow

# Bidirectional embeddings, overrides, isolates and marks; zero-width and invisible characters;
# line and paragraph separators. U+FEFF counts except as the first character of an added line
# (a byte-order mark that starts a file).
HIDDEN = frozenset(
    [chr(c) for c in range(0x202A, 0x202F)]     # LRE RLE PDF LRO RLO
    + [chr(c) for c in range(0x2066, 0x206A)]   # LRI RLI FSI PDI
    + [chr(c) for c in range(0x200B, 0x2010)]   # ZWSP ZWNJ ZWJ LRM RLM
    + [chr(c) for c in range(0x2060, 0x2065)]   # word joiner, invisible operators
    + ["\u061c", "\u180e", "\u2028", "\u2029", "\ufeff"]
)


def _name(char: str) -> str:
    return f"U+{ord(char):04X} {unicodedata.name(char, 'UNNAMED')}"


def hidden_controls(patch, shown: str) -> list:
    """One problem per added line of ``patch`` (a parsed ``PatchFile``) that holds a hidden
    control, and per file name that does; ``shown`` is the patch file as the report names it."""
    problems = [f"{shown}: it changes the file {path!r}, whose name holds "
                f"{', '.join(dict.fromkeys(_name(c) for c in path if c in HIDDEN))}: a bidirectional or "
                f"invisible control in a file name shows another name than git uses"
                for path in patch.files if any(c in HIDDEN for c in path)]
    if not patch.added_at:
        return problems
    lines = read_nofollow(patch.path).decode("utf-8").split("\n")  # parse_patch read and checked it
    for patch_line, target, new_line in patch.added_at:
        text = lines[patch_line - 1][1:]
        found = [c for i, c in enumerate(text) if c in HIDDEN and not (c == "\ufeff" and i == 0)]
        if found:
            said = ", ".join(dict.fromkeys(_name(c) for c in found))
            problems.append(f"{shown}:{patch_line}: the line it adds to {target}:{new_line} holds {said}: a "
                            f"bidirectional or invisible control makes the line read differently from "
                            f"what runs (remove it, or write it as an escape such as \\u{ord(found[0]):04x})")
    return problems
