"""Video: exact frame tables, exact clip decoding, clip sampling rules."""

from stoker.video.decode import decode_frames
from stoker.video.sampling import clip_indices
from stoker.video.table import FrameTable, VideoError, scan_video

__all__ = ["FrameTable", "VideoError", "clip_indices", "decode_frames", "scan_video"]
