/* OpenCV's bilinear resize of 8-bit RGB (cv2.resize, INTER_LINEAR), in plain C, for decode_chunk.c.
 * See bilinear.c for why it is ours and how its pixels compare with OpenCV's. */
#ifndef STOKER_BILINEAR_H
#define STOKER_BILINEAR_H

#include <stddef.h>
#include <stdint.h>

/* A view of RGB pixels: rows of `width` pixels, `stride` bytes apart. */
typedef struct {
    uint8_t *pixels;
    long height, width;
    size_t stride;
} Pixels;

/* Scratch the resize reuses: grown as needed, freed by scratch_free. */
typedef struct {
    void *memory;
    size_t size;
} Scratch;

void *scratch_get(Scratch *scratch, size_t size);
void scratch_free(Scratch *scratch);

/* Resizes `src` into `dst` (its size is the output's) as cv2.resize(src, (dst.width, dst.height),
 * interpolation=INTER_LINEAR) does; 0, or -1 when memory runs out. */
int resize_bilinear(Pixels src, Pixels dst, Scratch *scratch);

/* Mirrors `image` left to right in place (cv2.flip(image, 1)). */
void flip_columns(Pixels image);

#endif
