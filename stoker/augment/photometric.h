/* What the photometric kernels (photometric_kernels.c) and the extension's module (_photometric.c)
   share: the op codes and the numbers in an op's slot of the arrays, torchvision's luma weights, the
   clamps, a chunk's arrays and the builds of the kernels. The Python side reads the same values from
   stoker/augment/opcodes.py; the module exports these (BRIGHTNESS..NORMALIZE, PARAMS, GRAY) and
   tests/test_photometric.py checks that they are the same. */
#ifndef STOKER_PHOTOMETRIC_H
#define STOKER_PHOTOMETRIC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Op codes and each op's parameters (params[0..PARAMS-1] of its slot): */
enum {
    BRIGHTNESS = 1, /* factor */
    CONTRAST,       /* factor */
    SATURATION,     /* factor */
    HUE,            /* shift in turns, -0.5..0.5 */
    GRAYSCALE,      /* on: 0 or 1 */
    NORMALIZE,      /* 1/std and -mean/std of r, g, b */
    LAST_OP = NORMALIZE,
};
#define PARAMS 6

/* torchvision's luma weights (ITU-R 601-2) in float32, as stoker.augment.color uses them: contrast's
   mean, saturation's blend, grayscale */
static const float GRAY[3] = {0.2989f, 0.587f, 0.114f};

#define INLINE static inline __attribute__((always_inline))

INLINE float max_f(float a, float b) { return a > b ? a : b; } /* SSE's maxps, as OpenCV's v_max */
INLINE float min_f(float a, float b) { return a < b ? a : b; }
/* The clamps to [0, 1] of color.py's OpenCV forms: cv2.THRESH_TRUNC at 1 and THRESH_TOZERO at 0 */
INLINE float clamp_top(float x) { return min_f(1.0f, x); }
INLINE float clamp_bottom(float x) { return max_f(x, 0.0f); }
INLINE float clamp(float x) { return clamp_bottom(clamp_top(x)); }

/* Everything one call needs: the arrays (validated by the module), and the scratch of the calling thread. */
typedef struct {
    const uint8_t *crops;
    float *out_floats;   /* one of the two is set: the batch's float32 slots */
    uint8_t *out_bytes;  /* or its uint8 ones */
    const int32_t *ops;
    const double *params;
    const int64_t *positions;
    Py_ssize_t count, height, width, nops;
    float *work; /* height * width * 3 floats, for uint8 output (float output works in its slot) */
} Chunk;

/* The builds of the kernels, fastest first (photometric_kernels.c says which and why), by name. */
extern const char *const PHOTOMETRIC_BUILD_NAMES[];
extern const int PHOTOMETRIC_BUILD_COUNT;

/* Whether this CPU runs `build` (an index into PHOTOMETRIC_BUILD_NAMES). */
int photometric_build_runs_here(int build);

/* Every crop of `c` through its ops into its slot, with `build`; needs no GIL. */
void photometric_run(const Chunk *c, int build);

#endif
