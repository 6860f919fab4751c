"""The thread-pipelined loader: read, decode at reduced DCT scale, crop and batch, without processes."""

from stoker.decode.crops import CropSpec
from stoker.loader.from_source import loader_for
from stoker.loader.loader import Loader

__all__ = ["CropSpec", "Loader", "loader_for"]
