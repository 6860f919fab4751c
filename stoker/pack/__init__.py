"""Packing: sources (image folders, path lists) -> checked samples -> shards, on worker processes."""

from stoker.pack.finish import PackResult
from stoker.pack.images import ImageInfo, inspect_image
from stoker.pack.packer import pack
from stoker.pack.writer import ShardWriter
from stoker.sources import BadInput, Source, open_source

__all__ = ["BadInput", "ImageInfo", "PackResult", "ShardWriter", "Source", "inspect_image", "open_source", "pack"]
