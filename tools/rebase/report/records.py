"""``check --strict-records``: the committed ``REBASE_REPORT.json`` is a report, and
``REBASE_REPORT.md`` is what rendering it gives.

The two files are data a pull request can write. A release check that passes them unread would
let a file that is no report, or a Markdown page that says other than its JSON, stand as the
record of the last bump. The JSON is held to the report's schema (its ``schema`` tag, the top-level
fields and their types, every mapping entry's fields the page is rendered from), must render, and
must be written as the tool writes it; the Markdown must be that rendering, byte for byte.
"""

import json

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow
from tools.rebase.report.render import render_markdown
from tools.rebase.report.report import SCHEMA, dumps

# Top-level fields of a report (``build_report``) and the type of each.
FIELDS = {"schema": str, "old": dict, "new": dict, "counts": dict, "mapping": list, "upstream_churn": dict,
          "review": list, "warnings": list, "tests_run": bool, "range_diff": str}
SIDE_FIELDS = {"base": dict, "tip": str, "count": int}
ENTRY_FIELDS = {"status": str, "note": str, "old": list, "new": list, "old_numbers": list, "new_numbers": list,
                "files": dict}


def _shape(data, fields: dict, where: str) -> list:
    if not isinstance(data, dict):
        return [f"{where} is a {type(data).__name__}, not an object"]
    problems = [f"{where} lacks {k!r}" for k in fields if k not in data]
    problems += [f"{where}.{k} is a {type(data[k]).__name__}, not a {t.__name__}" for k, t in fields.items()
                 if k in data and not (isinstance(data[k], t) and not (t is int and isinstance(data[k], bool)))]
    return problems


def schema_problems(data) -> list:
    """What keeps ``data`` from being a report ``build_report`` writes (first problems only)."""
    problems = _shape(data, FIELDS, "the report")
    if problems:
        return problems
    if data["schema"] != SCHEMA:
        return [f"its schema is {data['schema']!r}, not {SCHEMA!r}"]
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        return [f"the report has fields no report has: {', '.join(unknown)}"]
    for side in ("old", "new"):
        problems += _shape(data[side], SIDE_FIELDS, f"the report.{side}")
    for i, entry in enumerate(data["mapping"]):
        problems += _shape(entry, ENTRY_FIELDS, f"mapping[{i}]")
    return problems[:5]


def _read(path, shown: str):
    """``(text, problem)`` of one report file: a regular file, bounded, UTF-8."""
    try:
        return read_nofollow(path).decode("utf-8"), None
    except RebaseError as exc:
        return None, f"{shown}: {str(exc).split(': ', 1)[-1]}"
    except UnicodeDecodeError as exc:
        return None, f"{shown}: not UTF-8 ({exc})"


def report_record_problems(layout) -> list:
    """Problems of the line's committed report pair; none when the line has neither file."""
    md, js = layout.report_md, layout.report_json
    shown_md, shown_js = layout.rel(md), layout.rel(js)
    present = [p for p in (md, js) if p.exists() or p.is_symlink()]
    if not present:
        return []
    if len(present) == 1:
        have, lack = (shown_md, shown_js) if present[0] == md else (shown_js, shown_md)
        return [f"{have}: there is no {lack} beside it (the report is written as both)"]
    text, problem = _read(js, shown_js)
    if problem:
        return [problem]
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return [f"{shown_js}: not a report: not JSON ({exc})"[:400]]
    problems = schema_problems(data)
    if problems:
        return [f"{shown_js}: not a report: {p}" for p in problems]
    try:
        page = render_markdown(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        return [f"{shown_js}: not a report: it does not render ({type(exc).__name__}: {exc})"[:400]]
    problems = []
    if dumps(data) != text:
        problems.append(f"{shown_js}: not written as the tool writes a report (indented, keys sorted); "
                        f"regenerate it with `python -m tools.rebase report{layout.line_flag}`")
    page_text, problem = _read(md, shown_md)
    if problem:
        return problems + [problem]
    if page_text != page:
        problems.append(f"{shown_md}: does not match what {shown_js} renders to (edited by hand, or the two "
                        f"are from different runs); regenerate both with `python -m tools.rebase "
                        f"report{layout.line_flag}`")
    return problems
