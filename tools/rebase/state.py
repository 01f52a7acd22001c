"""What the last apply/export produced, so re-running with nothing changed is a fast no-op."""

import json
import os


def read_state(layout) -> dict:
    try:
        return json.loads(layout.state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_state(layout, **values) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, layout.state_file)


def current_digest(layout, patches) -> str:
    """Digest of what apply builds from: the pin, the series and every patch file, in order."""
    from tools.rebase.stack import stack_digest

    return stack_digest(
        layout.pin.read_bytes(),
        layout.series.read_bytes(),
        [p.path.read_bytes() for p in patches],
    )
