"""timm's training transform through stoker.Loader against timm's own DataLoader path, one run.

The same as ``stoker bench loader --transform timm`` (stoker/bench/loader.py, readers/timm_train.py):
timm's ``create_transform(224, is_training=True)`` through ``create_dataset`` + ``create_loader``
(a DataLoader with a worker per core, as timm's train.py takes it) and through
``stoker.Loader(ShardDataset(shards), transform=<the same transform>)``, the same packed photos,
printing both rates and their ratio (issue 39's target: >= 4x on 2 cores). Needs timm: run it with
.venv-tv's Python.

    .venv-tv/bin/python bench/timm.py            # 4,000 sample photos, medians of 3 (an idle machine)
    .venv-tv/bin/python bench/timm.py --quick    # a look in under a minute: 320 photos, one run, batch 64,
                                                 # on a busy machine too (its figures are then noise)
"""

from __future__ import annotations

import sys

from stoker.cli import main

QUICK = ["--data", "bench-data/timm-quick", "--count", "320", "--repeat", "1", "--batch", "64", "--force"]

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--quick" in args:
        args = QUICK + [a for a in args if a != "--quick"]
    elif "--data" not in args:
        args += ["--data", "bench-data/loader"]
    sys.exit(main(["bench", "loader", "--transform", "timm", *args]))
