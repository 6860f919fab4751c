"""Images decoded into the slots of a batch: the crop geometry of a pass (crops.py), one image
decoded fused with its crop (per_image.py), the C extensions behind both (``_jpeg_region``, with
``decode_chunk`` for a chunk of samples per call, and ``_resample``), and the per-thread scratch
memory they decode into (scratch.py). The Loader's strategies (stoker/loader/) call these; so do
the doctor's probes and the transform reader (stoker/transforms/), which asks crops.py what a
torchvision crop becomes."""
