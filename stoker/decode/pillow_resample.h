/* Pillow's antialiased resize, cut to a crop (pillow_resample.c): compiled into
 * stoker.decode._resample (resize_crop) and stoker.decode._jpeg_region (decode_chunk.c's exact crops). */
#ifndef STOKER_PILLOW_RESAMPLE_H
#define STOKER_PILLOW_RESAMPLE_H

#include <stdint.h>

enum { RESAMPLE_BAD_SIZES = -1, RESAMPLE_NO_MEMORY = -2 };

/* Pillow's resampling filters, in the order of crops.RESAMPLE_FILTERS. */
enum { FILTER_BILINEAR = 0, FILTER_BICUBIC = 1, FILTER_LANCZOS = 2, FILTER_HAMMING = 3, FILTER_BOX = 4, FILTERS = 5 };

/* Which pass Pillow runs first (the passes round to 8 bits in between): the horizontal one always
 * (Pillow before 13), or the vertical one where the height shrinks by more than twice as many
 * pixels as the width (Pillow 13). per_image.PILLOW_PASSES says which the installed Pillow does. */
enum { PASSES_HORIZONTAL_FIRST = 0, PASSES_PILLOW_13 = 1 };

/* Whether pillow_resize_crop takes these sizes: every side 1..2^20 and the crop's offsets within
 * +-2^20 (no int product of them overflows), a known filter and order of passes. */
int pillow_resize_fits(long height, long width, long resized_h, long resized_w, long top, long left, long out_h,
                       long out_w, int filter, int passes);

/* Resizes the RGB image `src` (height x width, rows packed: stride width * 3) to resized_h x
 * resized_w with Pillow's `filter`, its passes in the order `passes` says, and writes the out_h x out_w part whose top-left pixel is
 * (top, left) into `out` (rows packed): the bytes of Pillow's resize then crop. Pixels of the crop
 * outside the resize (a negative offset, a crop past its end: what CenterCrop pads) are 0. Needs
 * no GIL. 0; RESAMPLE_BAD_SIZES where pillow_resize_fits says no; RESAMPLE_NO_MEMORY. */
int pillow_resize_crop(const uint8_t *src, long height, long width, long resized_h, long resized_w, long top, long left,
                       int filter, int passes, uint8_t *out, long out_h, long out_w);

#endif
