"""Packing: sources (image folders, path lists) -> checked samples -> shards, on worker processes."""

from stoker.pack.images import BadInput, ImageInfo, inspect_image
from stoker.pack.packer import PackResult, pack
from stoker.pack.sources import Source, open_source
from stoker.pack.writer import ShardWriter

__all__ = ["BadInput", "ImageInfo", "PackResult", "ShardWriter", "Source", "inspect_image", "open_source", "pack"]
