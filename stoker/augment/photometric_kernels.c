/* The photometric kernels: ColorJitter's four adjustments, RandomGrayscale, ToTensor's scaling to
   [0, 1] and Normalize, as stoker.augment.color computes them with OpenCV and numpy, for every crop of
   a chunk without the GIL (_photometric.c checks the arrays and calls photometric_run; photometric.h
   holds what both share: op codes, parameters per op, luma weights, clamps).

   Each op is one function over a row of interleaved pixels (r, g, b, r, g, b, ...) in place, as the
   image holds them: no split into planes and back. The ops of a stage run on one row after
   another while it is in the L1 cache, so an image is read and written once per stage. Brightness
   and contrast are the same product for every value; Normalize's per-channel constants repeat
   every 24 values (8 pixels, whole vectors); saturation, hue and grayscale read each pixel's r, g, b
   with stride 3, which GCC vectorizes with shuffles (not under -fwrapv, Python's default flag: its
   wrapping 3 * i is no longer an affine index, so setup.py adds -fno-wrapv). Contrast blends with
   the mean luma of the whole image as it is just before it, so it splits an image's ops into
   stages: each stage is one pass over the rows, and a stage followed by a contrast sums its
   output's channels. The scaling of the bytes and a first brightness are one pass.

   The arithmetic is OpenCV's (its 8-lane AVX2 paths, which the x86-64 wheel of opencv-python runs):
   a fused multiply-add wherever OpenCV's universal intrinsics use one (v_muladd, v_matmuladd), the
   same FLT_EPSILON guards and sector selection in the HSV round trip, numpy's float32 products for
   brightness and the scaling. Built with -ffp-contract=off so that only the fmaf calls below fuse;
   AVX-512 and AVX2+FMA builds of the loop beside the baseline, the fastest the CPU runs chosen at
   run time (see photometric_run). The other flags setup.py gives let GCC vectorize without changing a value:
   -fno-wrapv (above), and -ffinite-math-only -fno-signed-zeros, without which a clamp compiles to
   a compare and a blend instead of minps/maxps (every value here is finite, and the sign of a zero
   changes no result). tests/test_photometric.py compares the results with apply_image's, in each
   build: equal to ~1e-6 in float32 (OpenCV's scalar tails of a row, the mean summed in float per
   row, then in double), at most 1 level where rounded back to uint8. */

#include "photometric.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

/* A row of pixels as the image holds them: interleaved, x[3 * i + c] for pixel i, channel c. */
#define PATTERN 24 /* 8 pixels: a whole number of pixels and of 8-float vectors (48 measured no faster with 16) */

/* The crop's bytes to [0, 1] as numpy's float32(x) * float32(1 / 255), then times a brightness
   factor (numpy's float32 product, clamped above only: a factor >= 0 keeps x >= 0) where one is
   first: both in one pass, each product rounded as numpy rounds it. */
INLINE void load_bytes(const uint8_t *src, float *x, int n, double brightness) {
    const float scale = (float)(1.0 / 255.0), f = (float)brightness;
    int i;
    if (brightness == 1)
        for (i = 0; i < 3 * n; i++)
            x[i] = (float)src[i] * scale;
    else if (brightness < 1)
        for (i = 0; i < 3 * n; i++)
            x[i] = (float)src[i] * scale * f;
    else
        for (i = 0; i < 3 * n; i++)
            x[i] = clamp_top((float)src[i] * scale * f);
}

INLINE void brightness(float *x, int n, double factor) {
    float f = (float)factor;
    int i;
    if (factor > 1)
        for (i = 0; i < 3 * n; i++)
            x[i] = clamp_top(x[i] * f);
    else
        for (i = 0; i < 3 * n; i++)
            x[i] *= f;
}

/* x * factor + mean * (1 - factor), one fused multiply-add as cv2.addWeighted's. */
INLINE void contrast(float *x, int n, double factor, double mean) {
    float f = (float)factor, offset = (float)(mean * (1 - factor));
    int i;
    if (factor > 1)
        for (i = 0; i < 3 * n; i++)
            x[i] = clamp(fmaf(x[i], f, offset));
    else
        for (i = 0; i < 3 * n; i++)
            x[i] = fmaf(x[i], f, offset);
}

/* One output channel of cv2.transform's 3x3 (+ offset) matrix row m. */
INLINE float transform(const float *m, float r, float g, float b, float offset) {
    return fmaf(r, m[0], fmaf(g, m[1], fmaf(b, m[2], offset)));
}

/* Blend with the pixel's own luma: the matrix factor * I + (1 - factor) * gray rows (numpy's
   arithmetic: the gray rows are float32, so their product with (1 - factor) is too). */
INLINE void saturation(float *x, int n, double factor) {
    float m[3][3], rest = (float)(1 - factor);
    int i, c, k;
    for (c = 0; c < 3; c++)
        for (k = 0; k < 3; k++)
            m[c][k] = (float)((c == k ? factor : 0.0) + (double)(rest * GRAY[k]));
    if (factor > 1)
        for (i = 0; i < n; i++) {
            float r = x[3 * i], g = x[3 * i + 1], b = x[3 * i + 2];
            x[3 * i] = clamp(transform(m[0], r, g, b, 0.0f));
            x[3 * i + 1] = clamp(transform(m[1], r, g, b, 0.0f));
            x[3 * i + 2] = clamp(transform(m[2], r, g, b, 0.0f));
        }
    else
        for (i = 0; i < n; i++) {
            float r = x[3 * i], g = x[3 * i + 1], b = x[3 * i + 2];
            x[3 * i] = transform(m[0], r, g, b, 0.0f);
            x[3 * i + 1] = transform(m[1], r, g, b, 0.0f);
            x[3 * i + 2] = transform(m[2], r, g, b, 0.0f);
        }
}

/* Rotate the HSV hue: OpenCV's float RGB -> HSV (hue in degrees), the shift added, HSV -> RGB. */
INLINE void hue(float *x, int n, double shift) {
    double turns = fmod(360.0 * shift, 360.0); /* Python's (360 * shift) % 360: forward only */
    float degrees = (float)(turns < 0 ? turns + 360.0 : turns);
    int i;
    for (i = 0; i < n; i++) {
        float r = x[3 * i], g = x[3 * i + 1], b = x[3 * i + 2];
        float high = max_f(max_f(r, g), b), low = min_f(min_f(r, g), b), chroma = high - low;
        float s = chroma / (fabsf(high) + FLT_EPSILON), h, sixths, whole, f, sector;
        float rise_r = g - b, rise_g = b - r, rise = r - g, base_r = g < b ? 360.0f : 0.0f, base = 240.0f;
        float t0, t1, t2, t3, out_r, out_g, out_b;
        /* hue in degrees from the largest channel (red first on ties): every candidate computed, then
           chosen with plain ifs that only pick values, which the compiler turns into vector selects */
        if (g == high) {
            rise = rise_g;
            base = 120.0f;
        }
        if (r == high) {
            rise = rise_r;
            base = base_r;
        }
        h = fmaf(rise, 60.0f / (chroma + FLT_EPSILON), base) + degrees;
        /* back to RGB: the sector (sixth of a turn, 0..5) and the fraction into it */
        sixths = h * (6.0f / 360.0f);
        whole = (float)(int)sixths;
        f = sixths - whole;
        sector = whole - (float)(int)(whole * (1.0f / 6.0f)) * 6.0f;
        t0 = high, t1 = high * (1.0f - s), t2 = high * fmaf(-s, f, 1.0f), t3 = high * fmaf(-s, 1.0f - f, 1.0f);
        out_r = t0, out_g = t1, out_b = t2; /* sector 5 */
        if (sector == 4)
            out_r = t3;
        if (sector == 2 || sector == 3)
            out_r = t1;
        if (sector == 1)
            out_r = t2;
        if (sector == 3)
            out_g = t2;
        if (sector == 1 || sector == 2)
            out_g = t0;
        if (sector < 1)
            out_g = t3;
        if (sector == 3 || sector == 4)
            out_b = t0;
        if (sector == 2)
            out_b = t3;
        if (sector < 2)
            out_b = t1;
        x[3 * i] = out_r;
        x[3 * i + 1] = out_g;
        x[3 * i + 2] = out_b;
    }
}

/* Luma in all three channels, where on. */
INLINE void grayscale(float *x, int n, double on) {
    int i;
    if (on == 0)
        return;
    for (i = 0; i < n; i++) {
        float y = transform(GRAY, x[3 * i], x[3 * i + 1], x[3 * i + 2], 0.0f);
        x[3 * i] = x[3 * i + 1] = x[3 * i + 2] = y;
    }
}

/* (x - mean) / std per channel, as x * (1/std) + (-mean/std): whole blocks of PATTERN values with
   the channels' constants repeated to match (they vectorize), then pixel by pixel. */
INLINE void normalize(float *x, int n, const double *scale_offset) {
    float scale[PATTERN], offset[PATTERN];
    int i, k;
    for (k = 0; k < PATTERN; k++) {
        scale[k] = (float)scale_offset[k % 3];
        offset[k] = (float)scale_offset[3 + k % 3];
    }
    for (i = 0; i + PATTERN <= 3 * n; i += PATTERN)
        for (k = 0; k < PATTERN; k++)
            x[i + k] = fmaf(x[i + k], scale[k], offset[k]);
    for (; i < 3 * n; i++)
        x[i] = fmaf(x[i], scale[i % 3], offset[i % 3]);
}

INLINE void apply_op(int op, const double *params, float *x, int n, double mean) {
    switch (op) {
    case BRIGHTNESS: brightness(x, n, params[0]); break;
    case CONTRAST: contrast(x, n, params[0], mean); break;
    case SATURATION: saturation(x, n, params[0]); break;
    case HUE: hue(x, n, params[0]); break;
    case GRAYSCALE: grayscale(x, n, params[0]); break;
    case NORMALIZE: normalize(x, n, params); break;
    }
}

/* Rounded back to uint8 as BatchMaker does: x * 255, rounded half to even. */
INLINE uint8_t to_byte(float x) {
    float y = rintf(x * 255.0f);
    return (uint8_t)(y < 0.0f ? 0.0f : y > 255.0f ? 255.0f : y);
}

INLINE void store_bytes(const float *x, int n, uint8_t *dst) {
    int i;
    for (i = 0; i < 3 * n; i++)
        dst[i] = to_byte(x[i]);
}

/* Each channel's sum over a row, added to sums: float partial sums, PATTERN of them (they
   vectorize; each adds width / 8 values in [0, 1], ~1e-7 off), then in double. */
INLINE void add_sums(const float *x, int n, double sums[3]) {
    float partial[PATTERN] = {0};
    int i, k;
    for (i = 0; i + PATTERN <= 3 * n; i += PATTERN)
        for (k = 0; k < PATTERN; k++)
            partial[k] += x[i + k];
    for (; i < 3 * n; i++)
        sums[i % 3] += x[i];
    for (k = 0; k < PATTERN; k++)
        sums[k % 3] += partial[k];
}

/* Crop i of the chunk into its slot, its ops in stages split at each contrast. Each stage is one
   pass over the image, row by row, every op of the stage applied to the row in place while it is
   in the L1 cache; a stage followed by a contrast sums its output's channels. */
INLINE void apply_image(const Chunk *c, Py_ssize_t i) {
    Py_ssize_t slot = c->positions[i], pixels = c->height * c->width, line = c->width * 3, y;
    const uint8_t *crop = c->crops + i * pixels * 3;
    const int32_t *ops = c->ops + slot * c->nops;
    const double *params = c->params + slot * c->nops * PARAMS;
    float *work = c->out_floats ? c->out_floats + slot * pixels * 3 : c->work;
    int width = (int)c->width;
    Py_ssize_t start, stop, k;
    double mean = 0;
    int stage;

    /* stage 0: the ops before the first contrast; each later stage: a contrast and the ops up to the next */
    for (stage = 0, start = 0;; stage++, start = stop) {
        double sums[3] = {0, 0, 0};
        Py_ssize_t first = start;
        int last;
        stop = stage == 0 ? 0 : start + 1;
        while (stop < c->nops && ops[stop] != CONTRAST)
            stop++;
        last = stop == c->nops;
        for (y = 0; y < c->height; y++) {
            float *x = work + y * line;
            if (stage == 0) { /* the scaling, with a first brightness */
                int bright = start < stop && ops[start] == BRIGHTNESS;
                load_bytes(crop + y * line, x, width, bright ? params[start * PARAMS] : 1.0);
                first = start + bright;
            }
            for (k = first; k < stop; k++)
                apply_op(ops[k], params + k * PARAMS, x, width, mean);
            if (!last)
                add_sums(x, width, sums);
            else if (!c->out_floats)
                store_bytes(x, width, c->out_bytes + slot * pixels * 3 + y * line);
        }
        if (last)
            break;
        /* the next contrast's mean luma: cv2.mean's channel means, dotted with the luma weights */
        mean = (double)GRAY[0] * (sums[0] * (1.0 / pixels)) + (double)GRAY[1] * (sums[1] * (1.0 / pixels)) +
               (double)GRAY[2] * (sums[2] * (1.0 / pixels));
    }
}

static void apply_all(const Chunk *c) {
    Py_ssize_t i;
    for (i = 0; i < c->count; i++)
        apply_image(c, i);
}

/* The builds of that loop, fastest first: where GCC or clang can check the CPU at run time, an
   AVX-512 one (16-float vectors; its shuffles and masks make the stride-3 pixel loops ~1.8x faster
   than AVX2's, measured on an AMD EPYC) and an AVX2 + FMA one beside the baseline's (whose fmaf
   calls go to libm). Every build computes the same values; apply_chunk runs the first that this
   CPU can, or the one asked for (its BUILDS lists them, so that the tests check each). */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) static void
apply_all_avx512(const Chunk *c) {
    Py_ssize_t i;
    for (i = 0; i < c->count; i++)
        apply_image(c, i);
}

__attribute__((target("avx2,fma"))) static void apply_all_avx2(const Chunk *c) {
    Py_ssize_t i;
    for (i = 0; i < c->count; i++)
        apply_image(c, i);
}

const char *const PHOTOMETRIC_BUILD_NAMES[] = {"avx512", "avx2", "baseline"};
const int PHOTOMETRIC_BUILD_COUNT = 3;

int photometric_build_runs_here(int build) {
    switch (build) {
    case 0:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    case 1: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return 1;
    }
}

void photometric_run(const Chunk *c, int build) {
    switch (build) {
    case 0: apply_all_avx512(c); break;
    case 1: apply_all_avx2(c); break;
    default: apply_all(c);
    }
}
#else
const char *const PHOTOMETRIC_BUILD_NAMES[] = {"baseline"};
const int PHOTOMETRIC_BUILD_COUNT = 1;

int photometric_build_runs_here(int build) { return build == 0; }

void photometric_run(const Chunk *c, int build) {
    (void)build;
    apply_all(c);
}
#endif
