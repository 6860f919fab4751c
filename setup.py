"""Build the optional C extensions; project metadata lives in pyproject.toml.

stoker.decode._jpeg_region (region-of-interest JPEG decode) and stoker.pack._jpeg_restart (lossless
transcode for `stoker pack --restart-rows`) link libjpeg(-turbo). Where its headers are missing (no
libjpeg-turbo8-dev / libjpeg62-turbo-dev / libjpeg-turbo-devel) the build only warns and stoker
installs without them; the Loader then decodes whole images with simplejpeg and warns once (`stoker
env` lists it), and --restart-rows is refused. `make wheel` builds a wheel that carries libjpeg-turbo
(auditwheel repair). stoker.decode._resample (Pillow's resize, cut to a crop: the exact Resize +
CenterCrop path) needs only a C compiler; without it that path calls Pillow. So does
stoker.augment._photometric (ColorJitter, grayscale and Normalize for a chunk of crops, without the GIL);
without it the Loader augments each image with OpenCV calls.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # decode_chunk.c (a chunk of samples per call, without the GIL) shares the region decode;
        # bilinear.c resizes as cv2.resize, pillow_resample.c as Pillow (the exact crops, the same
        # source as _resample's); no FMA contraction, so crop boxes round as crops.py's do
        Extension("stoker.decode._jpeg_region",
                  ["stoker/decode/_jpeg_region.c", "stoker/decode/decode_chunk.c", "stoker/decode/bilinear.c",
                   "stoker/decode/pillow_resample.c"],
                  libraries=["jpeg"], extra_compile_args=["-ffp-contract=off"],
                  depends=["stoker/_jpeg_strict.h", "stoker/decode/region.h", "stoker/decode/bilinear.h",
                           "stoker/decode/pillow_resample.h", "third_party/xxhash/xxhash.h"], optional=True),
        Extension("stoker.pack._jpeg_restart", ["stoker/pack/_jpeg_restart.c"], libraries=["jpeg"],
                  depends=["stoker/_jpeg_strict.h"], optional=True),
        Extension("stoker.decode._resample", ["stoker/decode/_resample.c", "stoker/decode/pillow_resample.c"],
                  extra_compile_args=["-ffp-contract=off"], depends=["stoker/decode/pillow_resample.h"], optional=True),
        # the module (argument checks) and the kernels, which share photometric.h
        Extension("stoker.augment._photometric", ["stoker/augment/_photometric.c", "stoker/augment/photometric_kernels.c"],
                  # the kernels' header says why each: fused multiply-adds only where written, vectorized loops
                  extra_compile_args=["-ffp-contract=off", "-fno-trapping-math", "-fno-wrapv", "-ffinite-math-only",
                                      "-fno-signed-zeros"],
                  depends=["stoker/augment/photometric.h"], optional=True),
    ],
)
