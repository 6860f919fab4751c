"""Video: exact frame tables, exact clip decoding, clip sampling rules, and VideoClipDataset."""

from stoker.video.dataset import VideoClipDataset
from stoker.video.decode import decode_frames
from stoker.video.sampling import clip_indices
from stoker.video.table import FrameTable, VideoError, scan_video

__all__ = ["FrameTable", "VideoClipDataset", "VideoError", "clip_indices", "decode_frames", "scan_video"]
