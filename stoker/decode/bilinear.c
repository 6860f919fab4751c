/* OpenCV's bilinear resize of 8-bit RGB, in plain C, for decode_chunk.c.
 *
 * decode_chunk resizes every crop of a chunk with the GIL released; calling cv2.resize instead
 * would take the GIL for each image (OpenCV has no C API to call from here, and the opencv-python
 * wheel ships no headers). The arithmetic is OpenCV's (imgproc/src/resize.cpp, INTER_LINEAR, 8U):
 * source coordinates (dx + 0.5) * scale - 0.5 in float, clamped at the edges, weights rounded to
 * 11-bit fixed point, a horizontal pass to int rows, then a vertical pass that rounds as OpenCV's
 * SIMD path does ((S >> 4) * beta >> 16, summed, + 2 >> 2; the wheel's OpenCV 5.1 rounds every value
 * of a row so, its tails included). A resize to exactly half both ways is a 2x2 average, as
 * OpenCV's INTER_AREA shortcut that INTER_LINEAR takes there. The pixels equal cv2.resize's:
 * tests/test_decode_chunk.py compares them for hundreds of sizes. */
#include "bilinear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#define COEF_BITS 11
#define COEF_SCALE (1 << COEF_BITS)

void *scratch_get(Scratch *scratch, size_t size) {
    if (size > scratch->size) {
        void *grown = realloc(scratch->memory, size);
        if (grown == NULL) return NULL;
        scratch->memory = grown;
        scratch->size = size;
    }
    return scratch->memory;
}

void scratch_free(Scratch *scratch) {
    free(scratch->memory);
    scratch->memory = NULL;
    scratch->size = 0;
}

static short round_coefficient(float weight) { return (short)lrintf(weight * COEF_SCALE); }

/* For each output column or row: the first source pixel and the weights of it and the next, as
 * OpenCV computes them. `clamp_weights` is OpenCV's edge rule for columns; rows are clamped when read. */
static void coordinates(long source, long target, int clamp_weights, long *first, short *weights) {
    double scale = 1.0 / ((double)target / (double)source);
    long i;
    for (i = 0; i < target; i++) {
        float f = (float)((i + 0.5) * scale - 0.5);
        long s = (long)floorf(f);
        f -= (float)s;
        if (clamp_weights && s < 0) f = 0, s = 0;
        if (clamp_weights && s >= source - 1) f = 0, s = source - 1;
        first[i] = s;
        weights[2 * i] = round_coefficient(1.f - f);
        weights[2 * i + 1] = round_coefficient(f);
    }
}

/* The horizontal pass of one source row: for each output pixel x, the source pixels at byte
 * offset[x] and offset[x] + 3 weighted by weights[8x..8x+5] (w0, w1 for each channel), >> 4 as
 * OpenCV's vertical pass first does (255 * 2048 >> 4 fits 16 bits: nothing saturates). `out` has
 * room for one value more than the row's (the SSSE3 loop stores 4 values a pixel). */
static void horizontal_plain(const uint8_t *row, long from, long to, const int *offset, const short *weights, short *out) {
    long x;
    int c;
    for (x = from; x < to; x++) {
        const uint8_t *p = row + offset[x];
        for (c = 0; c < 3; c++) out[3 * x + c] = (short)((p[c] * weights[8 * x] + p[c + 3] * weights[8 * x + 1]) >> 4);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
/* The same with SSSE3, a pixel at a time: an 8-byte load holds both source pixels; a shuffle pairs
 * each channel's two bytes as 16-bit values, one multiply-add per channel. Measured here on a row of
 * 224 pixels from 300: 220 ns against 1,150 for the plain loop (AVX2 gathers). Reads 8 bytes from
 * each offset, so the caller keeps the pixels whose 8 bytes pass the row's end on the plain loop. */
__attribute__((target("ssse3"))) static void horizontal_ssse3(const uint8_t *row, long to, const int *offset,
                                                              const short *weights, short *out) {
    const __m128i pairs = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    long x;
    for (x = 0; x < to; x++) {
        __m128i v = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(row + offset[x])), pairs);
        __m128i sums = _mm_srai_epi32(_mm_madd_epi16(v, _mm_loadu_si128((const __m128i *)(weights + 8 * x))), 4);
        _mm_storel_epi64((__m128i *)(out + 3 * x), _mm_packs_epi32(sums, sums));
    }
}
#define HAVE_SSSE3_PATH 1
#endif

static void horizontal(const uint8_t *row, long width, long out_width, const int *offset, const short *weights, short *out) {
    long fast = 0;
#ifdef HAVE_SSSE3_PATH
    if (__builtin_cpu_supports("ssse3")) {
        while (fast < out_width && offset[fast] + 8 <= 3 * width) fast++; /* offsets grow with x */
        horizontal_ssse3(row, fast, offset, weights, out);
    }
#else
    (void)width;
#endif
    horizontal_plain(row, fast, out_width, offset, weights, out);
}

/* Two horizontal rows blended into one output row, rounded as OpenCV's vertical pass does:
 * ((s0 * b0) >> 16) + ((s1 * b1) >> 16), + 2 >> 2, saturated (the sum stays under 2,048: no
 * 16-bit overflow). */
static void vertical_plain(const short *s0, const short *s1, short b0, short b1, uint8_t *out, long from, long n) {
    long x;
    for (x = from; x < n; x++) {
        int t = ((((s0[x] * b0) >> 16) + ((s1[x] * b1) >> 16)) + 2) >> 2;
        out[x] = (uint8_t)(t < 0 ? 0 : t > 255 ? 255 : t);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
/* The same 16 values at a time with SSE2 (every x86-64 has it), as OpenCV's SIMD loop. */
static void vertical(const short *s0, const short *s1, short b0, short b1, uint8_t *out, long n) {
    const __m128i w0 = _mm_set1_epi16(b0), w1 = _mm_set1_epi16(b1), two = _mm_set1_epi16(2);
    long x;
    for (x = 0; x + 16 <= n; x += 16) {
        __m128i lo = _mm_add_epi16(_mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(s0 + x)), w0),
                                   _mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(s1 + x)), w1));
        __m128i hi = _mm_add_epi16(_mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(s0 + x + 8)), w0),
                                   _mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(s1 + x + 8)), w1));
        lo = _mm_srai_epi16(_mm_add_epi16(lo, two), 2);
        hi = _mm_srai_epi16(_mm_add_epi16(hi, two), 2);
        _mm_storeu_si128((__m128i *)(out + x), _mm_packus_epi16(lo, hi));
    }
    vertical_plain(s0, s1, b0, b1, out, x, n);
}
#else
static void vertical(const short *s0, const short *s1, short b0, short b1, uint8_t *out, long n) {
    vertical_plain(s0, s1, b0, b1, out, 0, n);
}
#endif

static void copy_rows(Pixels src, Pixels dst) {
    long y;
    for (y = 0; y < dst.height; y++) memcpy(dst.pixels + y * dst.stride, src.pixels + y * src.stride, (size_t)dst.width * 3);
}

static void halve(Pixels src, Pixels dst) {
    long y, x;
    int c;
    for (y = 0; y < dst.height; y++) {
        const uint8_t *a = src.pixels + 2 * y * src.stride, *b = a + src.stride;
        uint8_t *out = dst.pixels + y * dst.stride;
        for (x = 0; x < dst.width; x++)
            for (c = 0; c < 3; c++)
                out[3 * x + c] = (uint8_t)((a[6 * x + c] + a[6 * x + 3 + c] + b[6 * x + c] + b[6 * x + 3 + c] + 2) >> 2);
    }
}

/* Horizontal rows are cached in two slots, each computed once: output rows walk down the source. */
typedef struct {
    Pixels src;
    long out_width;
    const int *offset;   /* per output pixel */
    const short *weights; /* per output pixel: w0, w1 three times, two zeros */
    short *slots[2];
    long tags[2];
} RowCache;

/* Source row `r` (clamped to the image) through the horizontal pass, keeping the slot that holds row `keep`. */
static const short *cached_row(RowCache *cache, long r, long keep) {
    int slot;
    r = r < 0 ? 0 : r >= cache->src.height ? cache->src.height - 1 : r;
    keep = keep < 0 ? 0 : keep >= cache->src.height ? cache->src.height - 1 : keep;
    if (cache->tags[0] == r) return cache->slots[0];
    if (cache->tags[1] == r) return cache->slots[1];
    slot = cache->tags[0] == keep ? 1 : 0;
    if (cache->src.width > 1) {
        horizontal(cache->src.pixels + r * cache->src.stride, cache->src.width, cache->out_width, cache->offset,
                   cache->weights, cache->slots[slot]);
    } else { /* one source column: every output pixel is it (and there is no pixel beside it to read) */
        long i;
        for (i = 0; i < 3 * cache->out_width; i++) cache->slots[slot][i] = (short)((cache->src.pixels[r * cache->src.stride + i % 3] * COEF_SCALE) >> 4);
    }
    cache->tags[slot] = r;
    return cache->slots[slot];
}

int resize_bilinear(Pixels src, Pixels dst, Scratch *scratch) {
    long *xofs, *yofs, x, y, n = dst.width * 3;
    short *alpha, *beta, *weights;
    int *offset, c;
    char *memory;
    RowCache cache;

    if (src.height == dst.height && src.width == dst.width) {
        copy_rows(src, dst);
        return 0;
    }
    if (src.height == 2 * dst.height && src.width == 2 * dst.width) {
        halve(src, dst);
        return 0;
    }
    memory = scratch_get(scratch, (size_t)(dst.width + dst.height) * (sizeof(long) + 2 * sizeof(short)) +
                                      (size_t)dst.width * (sizeof(int) + 8 * sizeof(short)) +
                                      2 * (size_t)(n + 1) * sizeof(short) + 64);
    if (memory == NULL) return -1;
    xofs = (long *)memory;
    yofs = xofs + dst.width;
    offset = (int *)(yofs + dst.height);
    alpha = (short *)(offset + dst.width);
    beta = alpha + 2 * dst.width;
    weights = beta + 2 * dst.height;
    cache.slots[0] = weights + 8 * dst.width;
    cache.slots[1] = cache.slots[0] + n + 1;
    coordinates(src.width, dst.width, 1, xofs, alpha);
    coordinates(src.height, dst.height, 0, yofs, beta);
    for (x = 0; x < dst.width; x++) {
        /* the last column: OpenCV takes it alone (weight 1), here as the second of a pair (with one
         * source column, cached_row does not read these) */
        int last = xofs[x] + 1 >= src.width && src.width > 1;
        offset[x] = (int)(3 * (xofs[x] - last));
        for (c = 0; c < 3; c++) {
            weights[8 * x + 2 * c] = last ? 0 : alpha[2 * x];
            weights[8 * x + 2 * c + 1] = last ? COEF_SCALE : alpha[2 * x + 1];
        }
        weights[8 * x + 6] = weights[8 * x + 7] = 0;
    }
    cache.src = src;
    cache.out_width = dst.width;
    cache.offset = offset;
    cache.weights = weights;
    cache.tags[0] = cache.tags[1] = -1;
    for (y = 0; y < dst.height; y++) {
        const short *s0 = cached_row(&cache, yofs[y], yofs[y] + 1), *s1 = cached_row(&cache, yofs[y] + 1, yofs[y]);
        vertical(s0, s1, beta[2 * y], beta[2 * y + 1], dst.pixels + y * dst.stride, n);
    }
    return 0;
}

void flip_columns(Pixels image) {
    long y, x;
    for (y = 0; y < image.height; y++) {
        uint8_t *row = image.pixels + y * image.stride;
        for (x = 0; x < image.width / 2; x++) {
            uint8_t *a = row + 3 * x, *b = row + 3 * (image.width - 1 - x), t;
            int c;
            for (c = 0; c < 3; c++) t = a[c], a[c] = b[c], b[c] = t;
        }
    }
}
