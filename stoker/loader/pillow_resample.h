/* Pillow's antialiased bilinear resize, cut to a crop (pillow_resample.c): compiled into
 * stoker.loader._resample (resize_crop) and stoker.loader._jpeg_region (decode_chunk.c's exact crops). */
#ifndef STOKER_PILLOW_RESAMPLE_H
#define STOKER_PILLOW_RESAMPLE_H

#include <stdint.h>

enum { RESAMPLE_BAD_SIZES = -1, RESAMPLE_NO_MEMORY = -2 };

/* Whether pillow_resize_crop takes these sizes: every side 1..2^20 (no int product of them
 * overflows), the crop inside the resize. */
int pillow_resize_fits(long height, long width, long resized_h, long resized_w, long top, long left, long out_h,
                       long out_w);

/* Resizes the RGB image `src` (height x width, rows packed: stride width * 3) to resized_h x
 * resized_w with Pillow's bilinear filter and writes the out_h x out_w part whose top-left pixel is
 * (top, left) into `out` (rows packed): the bytes of Pillow's resize then crop. Needs no GIL.
 * 0; RESAMPLE_BAD_SIZES where pillow_resize_fits says no; RESAMPLE_NO_MEMORY. */
int pillow_resize_crop(const uint8_t *src, long height, long width, long resized_h, long resized_w, long top, long left,
                       uint8_t *out, long out_h, long out_w);

#endif
