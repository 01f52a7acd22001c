"""Benchmark (not a test): cold, hash-checked download of the pinned sdist (target < 15 s).

Downloads the sdist named in upstream.toml into an empty temporary cache with pip's own cache
off (``--pip-cache`` leaves it on), the way `apply` or `check` does on a fresh CI machine, and
prints the wall time. With
``--no-hash`` it times the `bump --onto pypi:` path instead (ask the index for the hash, then
download with it).

    python bench/sdist_download_bench.py [--repeat 3] [--no-hash]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.rebase.stack.pin import load_pin  # noqa: E402
from tools.rebase.stack.source import download_sdist, sha256_file  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-hash", action="store_true", help="time the bump path (hash taken from the index)")
    parser.add_argument("--pip-cache", action="store_true",
                        help="leave pip's own cache on (build-tool wheels may come from it)")
    args = parser.parse_args()
    pin = load_pin(ROOT / "upstream.toml")
    if pin.kind != "pypi":
        print(f"the pin is not an sdist ({pin.display}); nothing to time")
        return 1
    if not args.pip_cache:
        os.environ["PIP_NO_CACHE_DIR"] = "1"
    times = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache:
            start = time.monotonic()
            path = download_sdist(Path(cache), pin.package, pin.version, "" if args.no_hash else pin.sha256,
                                  log=lambda _msg: None)
            times.append(time.monotonic() - start)
            assert sha256_file(path) == pin.sha256, "the index served another archive than the pin names"
    mode = "hash from the index, then hash-checked" if args.no_hash else "hash-checked"
    mode += ", pip cache on" if args.pip_cache else ", pip cache off"
    print(f"{pin.package}=={pin.version} sdist, cold {mode} download: median {statistics.median(times):.1f} s "
          f"(min {min(times):.1f}, max {max(times):.1f}, n={len(times)}; target < 15 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
