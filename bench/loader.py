"""Loader benchmark: stoker.Loader against torch DataLoader and every peer that is installed.

The same as ``stoker bench loader`` (stoker/bench/loader.py), with the peers taken from the
environments that ``bench/peer-envs.sh`` makes under bench-envs/ (one per peer; a peer whose
environment is missing is reported as such).

    .venv/bin/python bench/loader.py                  # 4,000 sample photos, medians of 3, warm cache
    .venv/bin/python bench/loader.py --only stoker,limit,loose2
    ../shared/hdd-profile -- .venv/bin/python bench/loader.py --cold --only stoker,loose2
"""

from __future__ import annotations

import sys
from pathlib import Path

from stoker.bench.loader import PEERS
from stoker.cli import main

ENVS = Path(__file__).resolve().parent.parent / "bench-envs"

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--data" not in args:
        args += ["--data", "bench-data/loader"]
    for peer in PEERS:
        python = ENVS / peer / "bin" / "python"
        if python.exists():
            args += ["--peer", f"{peer}={python}"]
        else:
            print(f"peer {peer}: no environment at {python.parent.parent} (run bench/peer-envs.sh)", file=sys.stderr)
    sys.exit(main(["bench", "loader", *args]))
