"""The README is a first visit's page (issue 47): short, the quick start first, the fast test subset
named with a marker pytest knows, and CI still running every test."""

import configparser
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_fits_a_first_visit():
    assert len(README) < 12_000, f"README.md is {len(README)} characters; move reference text into docs/"
    sections = re.findall(r"^## (.+)$", README, re.M)
    assert sections[0] == "Quick start", sections


def test_the_fast_subset_is_named_and_its_marker_registered():
    assert 'python -m pytest tests -m "not slow"' in README
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    markers = [line.split(":", 1)[0].strip() for line in ini["pytest"]["markers"].strip().splitlines()]
    assert "slow" in markers  # an unregistered marker would only warn, and "-m" would select nothing


def test_ci_runs_every_test():
    runs = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip().startswith("python -m pytest")]
    assert runs == ["python -m pytest tests"], runs


def test_the_cpu_torch_command_uses_pytorchs_cpu_index():
    assert "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in README


def _stated_slow_count() -> int:
    m = re.search(r"leaves out the (\d+) tests marked `slow`", README)
    assert m, "README.md no longer states how many tests are marked slow"
    return int(m.group(1))


def test_the_stated_figures_name_the_commands_that_give_them():
    _stated_slow_count()
    assert "`python bench/suite_counts.py`" in README
    assert 'time python -m pytest tests\n[-m "not slow"]' in README or 'time python -m pytest tests [-m "not slow"]' in README


@pytest.mark.slow
def test_the_stated_slow_count_is_pytests_own():
    """One collection of the whole suite (about 40 s on 2 cores): the full run (CI) checks it."""
    from bench.suite_counts import counts

    found = counts(ROOT)
    assert found["slow"] == _stated_slow_count(), (
        f"README.md says {_stated_slow_count()} tests are marked slow; collection finds {found['slow']}: "
        f"update the figure with `python bench/suite_counts.py`")
