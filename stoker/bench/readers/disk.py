"""Reader: the disk's sequential rate: every shard file read front to back in 1 MiB pieces, as
``cat`` would, counted in the images each file holds. With ``stoker bench
loader --cold`` its first epoch is the bandwidth a cold-cache loader can at best be given."""

from __future__ import annotations

import _epochs

from stoker.format import read_manifest


def main() -> None:
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":
        return
    shards = read_manifest(args.shards).shards

    def epoch(number: int):
        for shard in shards:
            with open(args.shards / shard.name, "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass
            yield None, shard.count

    _epochs.report_epochs(epoch, args, count=lambda batch: batch[1])


if __name__ == "__main__":
    main()
