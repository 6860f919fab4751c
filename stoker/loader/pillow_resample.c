/* Pillow's antialiased bilinear resize, cut to the pixels a crop keeps.

   torchvision's Resize(short side) + CenterCrop on a PIL image is Pillow's ImagingResample with
   the bilinear filter over the whole image, then a crop. stoker's exact path (CropSpec.exact, what
   a translated torchvision Resize gets) must give those pixels, so this file computes the same
   sums in the same fixed point (Pillow's src/libImaging/Resample.c: precompute_coeffs,
   normalize_coeffs_8bpc, the horizontal then the vertical 8-bit pass), but only for the output
   rows and columns of the crop, straight from the decoder's 3-byte RGB rows.

   Why our own: measured here on the 500x375 sample photos, Pillow's resize of a decoded image
   costs ~780 us, of which ~450 us is Image.frombuffer unpacking RGB into Pillow's 4-byte pixels;
   the resize of a whole image then computes ~30% more pixels than the crop keeps. Pixels are
   identical to Pillow's (tests/test_resample.py checks every output byte against Pillow's resize
   + crop). Built with -ffp-contract=off: a fused multiply-add would round the filter's weights
   differently from Pillow's build.

   One source, compiled into two extensions (setup.py): stoker.loader._resample (resize_crop, for
   the per-image path, decode_crop.py) and stoker.loader._jpeg_region (decode_chunk.c's exact
   crops), so both give the same bytes by construction. */

#include "pillow_resample.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2) /* Pillow's: 8 bits of result, 2 of headroom */
#define MAX_SIDE (1 << 20)          /* every int product of sizes below stays far from overflow */
#define HALF (1 << (PRECISION_BITS - 1))

/* The taps of one axis: for each output index kept, the first source index and `width` fixed-point
   weights. Every output gets the same number of taps (the most any needs), its window moved
   inside the image and padded with zero weights, which add nothing: fixed-length loops that the
   compiler unrolls (the horizontal pass took ~400 of 570 us per photo with Pillow's
   variable-length ones). */
typedef struct {
    int width;
    int *first;
    int32_t *weights;
} Taps;

static void taps_free(Taps *taps) {
    free(taps->first);
    free(taps->weights);
}

static double bilinear(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Taps of output indices start..start+n-1 of a resize of in_size source pixels to out_size
   (Pillow's precompute_coeffs with the box the whole axis, then normalize_coeffs_8bpc). */
static int taps_init(Taps *taps, int in_size, int out_size, int start, int n) {
    double scale = (double)in_size / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale; /* the bilinear filter reaches 1 source pixel, times the shrink */
    double ss = 1.0 / filterscale;
    int ksize = (int)ceil(support) * 2 + 1; /* Pillow's bound on the taps of one output */
    int *lo = malloc(n * sizeof(int)), *count = malloc(n * sizeof(int));
    int32_t *k = malloc((size_t)n * ksize * sizeof(int32_t));
    double *w = malloc(ksize * sizeof(double));
    int i, x, ok = 0;

    taps->first = malloc(n * sizeof(int));
    taps->weights = NULL;
    if (!lo || !count || !k || !w || !taps->first)
        goto done;
    taps->width = 1;
    for (i = 0; i < n; i++) {
        double center = (start + i + 0.5) * scale, total = 0.0;
        int hi = (int)(center + support + 0.5);
        lo[i] = (int)(center - support + 0.5);
        if (lo[i] < 0)
            lo[i] = 0;
        if (hi > in_size)
            hi = in_size;
        count[i] = hi - lo[i];
        for (x = 0; x < count[i]; x++) {
            w[x] = bilinear((x + lo[i] - center + 0.5) * ss);
            total += w[x];
        }
        for (x = 0; x < count[i]; x++) {
            double v = total != 0.0 ? w[x] / total : w[x];
            k[(size_t)i * ksize + x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS) : 0.5 + v * (1 << PRECISION_BITS));
        }
        if (count[i] > taps->width)
            taps->width = count[i];
    }
    taps->weights = calloc((size_t)n * taps->width, sizeof(int32_t));
    if (!taps->weights)
        goto done;
    for (i = 0; i < n; i++) {
        int first = lo[i] + taps->width > in_size ? in_size - taps->width : lo[i];
        memcpy(taps->weights + (size_t)i * taps->width + (lo[i] - first), k + (size_t)i * ksize,
               count[i] * sizeof(int32_t));
        taps->first[i] = first;
    }
    ok = 1;
done:
    free(lo);
    free(count);
    free(k);
    free(w);
    return ok;
}

static inline uint8_t clip8(int32_t sum) {
    sum >>= PRECISION_BITS;
    return sum < 0 ? 0 : sum > 255 ? 255 : (uint8_t)sum;
}

/* One row of the horizontal pass with `width` taps per output; inlined with each constant width
   below, so that the compiler unrolls the taps. */
static inline __attribute__((always_inline)) void horizontal_row(const uint8_t *in, uint8_t *o, const Taps *cols,
                                                                  int out_w, const int width) {
    int i, t;
    for (i = 0; i < out_w; i++) {
        const int32_t *k = cols->weights + (size_t)i * width;
        const uint8_t *p = in + (size_t)cols->first[i] * 3;
        int32_t r = HALF, g = HALF, b = HALF;
        for (t = 0; t < width; t++) {
            r += p[3 * t] * k[t];
            g += p[3 * t + 1] * k[t];
            b += p[3 * t + 2] * k[t];
        }
        o[3 * i] = clip8(r);
        o[3 * i + 1] = clip8(g);
        o[3 * i + 2] = clip8(b);
    }
}

#define HORIZONTAL_ROWS(width)                                                              \
    for (y = row_lo; y < row_hi; y++)                                                        \
        horizontal_row(src + (size_t)y * src_w * 3, tmp + (size_t)(y - row_lo) * line, cols, \
                       out_w, width)

/* Where GCC can pick the code at load time (ifunc), an AVX2 build beside the baseline: measured
   here 475 instead of 546 us per photo (the vertical pass's 32-bit multiplies vectorize). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) /* ifunc: not musl */
#define CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_CLONES
#endif

/* The horizontal pass over source rows row_lo..row_hi-1 into tmp (rows of out_w RGB pixels), then
   the vertical pass into out; acc holds one output row of sums. */
CPU_CLONES static void resample(const uint8_t *src, int src_w, const Taps *cols, const Taps *rows, int row_lo, int row_hi,
                     int out_w, int out_h, uint8_t *tmp, int32_t *acc, uint8_t *out) {
    size_t line = (size_t)out_w * 3;
    int y, t, c;

    switch (cols->width) { /* 2-3 taps when upscaling, 3-4 for a shrink under 2x, 2 more per 1x */
    case 2: HORIZONTAL_ROWS(2); break;
    case 3: HORIZONTAL_ROWS(3); break;
    case 4: HORIZONTAL_ROWS(4); break;
    case 5: HORIZONTAL_ROWS(5); break;
    case 6: HORIZONTAL_ROWS(6); break;
    default: HORIZONTAL_ROWS(cols->width);
    }
    for (y = 0; y < out_h; y++) {
        const int32_t *k = rows->weights + (size_t)y * rows->width;
        const uint8_t *in = tmp + (size_t)(rows->first[y] - row_lo) * line;
        uint8_t *o = out + (size_t)y * line;
        for (c = 0; c < (int)line; c++)
            acc[c] = HALF;
        for (t = 0; t < rows->width; t++, in += line)
            for (c = 0; c < (int)line; c++)
                acc[c] += in[c] * k[t];
        for (c = 0; c < (int)line; c++)
            o[c] = clip8(acc[c]);
    }
}

int pillow_resize_fits(long height, long width, long resized_h, long resized_w, long top, long left, long out_h,
                       long out_w) {
    return height >= 1 && width >= 1 && resized_h >= 1 && resized_w >= 1 && out_h >= 1 && out_w >= 1 && top >= 0 &&
           left >= 0 && top <= resized_h - out_h && left <= resized_w - out_w && height <= MAX_SIDE && width <= MAX_SIDE &&
           resized_h <= MAX_SIDE && resized_w <= MAX_SIDE;
}

int pillow_resize_crop(const uint8_t *src, long height, long width, long resized_h, long resized_w, long top, long left,
                       uint8_t *out, long out_h, long out_w) {
    Taps cols = {0}, rows = {0};
    uint8_t *tmp = NULL;
    int32_t *acc = NULL;
    int row_lo, row_hi, rc = RESAMPLE_NO_MEMORY;

    if (!pillow_resize_fits(height, width, resized_h, resized_w, top, left, out_h, out_w))
        return RESAMPLE_BAD_SIZES;
    if (!taps_init(&cols, (int)width, (int)resized_w, (int)left, (int)out_w) ||
        !taps_init(&rows, (int)height, (int)resized_h, (int)top, (int)out_h))
        goto done;
    row_lo = rows.first[0];
    row_hi = rows.first[out_h - 1] + rows.width;
    tmp = malloc((size_t)(row_hi - row_lo) * (size_t)out_w * 3);
    acc = malloc((size_t)out_w * 3 * sizeof(int32_t));
    if (!tmp || !acc)
        goto done;
    resample(src, (int)width, &cols, &rows, row_lo, row_hi, (int)out_w, (int)out_h, tmp, acc, out);
    rc = 0;
done:
    free(tmp);
    free(acc);
    taps_free(&cols);
    taps_free(&rows);
    return rc;
}
