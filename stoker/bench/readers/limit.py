"""Reader: the decode-only limit: ``--workers`` threads of simplejpeg (fastdct, fastupsample, reused
output buffers: the fastest binding measured here) decoding every photo's bytes, nothing else.
The bytes are read into memory before the first epoch, so this measures decode alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import _epochs
import numpy as np
import simplejpeg

import stoker


def main() -> None:
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":
        return
    dataset = stoker.ShardDataset(args.shards, decode="raw")
    photos = [dataset.read_image(i)[0] for i in range(len(dataset))]  # bytes: no reuse buffer given

    def decode(chunk: np.ndarray) -> int:
        sizes = (simplejpeg.decode_jpeg_header(photos[i])[:2] for i in chunk)
        buffer = bytearray(max(height * width for height, width in sizes) * 3)
        for i in chunk:
            simplejpeg.decode_jpeg(photos[i], fastdct=True, fastupsample=True, buffer=buffer)
        return len(chunk)

    def epoch(number: int):
        order = np.random.default_rng(number).permutation(len(photos))
        batches = np.array_split(order, -(-len(photos) // args.batch))
        with ThreadPoolExecutor(args.workers) as pool:  # each batch split across the threads, as the loader does
            for batch in batches:
                yield None, list(pool.map(decode, np.array_split(batch, args.workers)))

    _epochs.report_epochs(epoch, args, count=lambda batch: sum(batch[1]))


if __name__ == "__main__":
    main()
