/* decode_chunk: a chunk of a batch's samples read, checked, decoded, cropped, resized and flipped
 * into their slots in one call, without the GIL.
 *
 * Done per image from Python (per_image.py), the work between the C calls held the GIL for
 * 50-80 us per image, so a process's threads stopped adding speed after a few cores. Here Python
 * plans a chunk once (which file, offset, size and checksum each sample has, its random draws) and
 * this loop does the rest per sample, the same steps as per_image.py's fast path: the crop box
 * (crops.py's rule), the DCT scale, the region decode (region_decode in _jpeg_region.c, strips of
 * restart-marker packs included), the cut, halving an axis that shrinks 2x or more, the bilinear
 * resize (bilinear.c: cv2.resize's pixels) and the flip. An exact crop (CropSpec.exact: a
 * translated Resize + CenterCrop) takes per_image.py's exact path instead: the whole image
 * decoded as simplejpeg's default decode, then Pillow's resize with the Resize's filter computed
 * for the crop's pixels, zeros where CenterCrop pads (pillow_resample.c, which the _resample
 * extension shares), and the flip. Its pixels are the Python path's; the tests compare the two.
 *
 * A sample this loop does not finish gets a status instead of pixels, and Python makes it the
 * slow way, which raises or skips as the Loader's on_error says, or decodes what only Pillow can:
 *   READ_FAILED: the read failed or came short, or the bytes do not match the index's checksum;
 *   NOT_DECODED: no JPEG, a JPEG libjpeg reports anything about (CMYK, corrupt, truncated, a bad
 *                restart table), a JPEG whose header claims more pixels than the pixel budget
 *                (stoker/pixels.py: refused before anything is allocated for its size), or memory
 *                ran out. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include "../../third_party/xxhash/xxhash.h"
#include "bilinear.h"
#include "pillow_resample.h"
#include "region.h"

enum { DONE = 0, READ_FAILED = 1, NOT_DECODED = 2 };
enum { RANDOM_RESIZED = 0, CENTER = 1, RESIZE = 2 };
#define CROP_TRIES 10 /* crops.CROP_TRIES */
#define STRIP_SLACK 64 /* per_image._STRIP_SLACK */

typedef struct {
    int kind, out_h, out_w, restarts, exact, filter, passes;
    double scale_lo, scale_hi, ratio_lo, ratio_hi, center_fraction;
    uint64_t max_pixels; /* the pixel budget */
} Spec;

typedef struct {
    long top, left, height, width;
} Box;

/* Per call: memory each sample reuses, grown to the largest. */
typedef struct {
    Scratch read, decode, strip, halved[2], resize;
} Buffers;

/* crops._center_offset: where CenterCrop's `crop` pixels start in `size` (negative: padded). */
static long center_offset(long size, long crop) {
    return size >= crop ? (long)nearbyint((double)(size - crop) / 2.0) : -((crop - size) / 2);
}

/* crops.exact_resize: the size torchvision's Resize gives the image and CenterCrop's offsets in it. */
static void exact_resize(const Spec *s, long h, long w, long *new_h, long *new_w, long *top, long *left) {
    double shorter;
    if (s->kind == RESIZE) {
        *new_h = s->out_h, *new_w = s->out_w, *top = 0, *left = 0;
        return;
    }
    shorter = nearbyint((double)(s->out_h < s->out_w ? s->out_h : s->out_w) / s->center_fraction);
    if (w <= h) {
        *new_h = (long)(shorter * (double)h / (double)w);
        *new_w = (long)shorter;
    } else {
        *new_h = (long)shorter;
        *new_w = (long)(shorter * (double)w / (double)h);
    }
    *top = center_offset(*new_h, s->out_h);
    *left = center_offset(*new_w, s->out_w);
}

/* crops.pads: whether CenterCrop pads this image (then the exact path makes it, exact or not). */
static int pads(const Spec *s, long h, long w) {
    long new_h, new_w, top, left;
    if (s->kind != CENTER) return 0;
    exact_resize(s, h, w, &new_h, &new_w, &top, &left);
    return new_h < s->out_h || new_w < s->out_w;
}

/* crops.crop_box, the same arithmetic in the same order (Python's round() is nearbyint's
 * round-half-even; int() of a positive float truncates): kept in step by tests/test_decode_chunk.py,
 * which draws thousands of boxes both ways. */
static Box crop_box(const Spec *s, long h, long w, const double *tries) {
    Box box;
    if (s->kind != RANDOM_RESIZED) {
        double top = 0, left = 0, ch = (double)h, cw = (double)w, bottom, right;
        if (s->kind == CENTER) {
            long new_h, new_w, t, l;
            double sy, sx;
            exact_resize(s, h, w, &new_h, &new_w, &t, &l);
            sy = (double)h / (double)new_h, sx = (double)w / (double)new_w;
            top = (double)t * sy, left = (double)l * sx, ch = s->out_h * sy, cw = s->out_w * sx;
            top = top > 0 ? top : 0, left = left > 0 ? left : 0; /* a crop CenterCrop pads: inside the image */
        }
        bottom = fmin((double)h, ceil(top + ch));
        right = fmin((double)w, ceil(left + cw));
        box.top = (long)top, box.left = (long)left;
        box.height = (long)bottom - box.top > 1 ? (long)bottom - box.top : 1;
        box.width = (long)right - box.left > 1 ? (long)right - box.left : 1;
        return box;
    } else {
        double area = (double)(h * w), log_lo = log(s->ratio_lo), log_hi = log(s->ratio_hi), ratio = (double)w / (double)h;
        int i;
        for (i = 0; i < CROP_TRIES; i++) {
            const double *u = tries + 4 * i;
            double target = area * (s->scale_lo + u[0] * (s->scale_hi - s->scale_lo));
            double aspect = exp(log_lo + u[1] * (log_hi - log_lo));
            /* compared before the cast: an absurd spec's huge or NaN sizes fail the test, as in Python */
            double cw = nearbyint(sqrt(target * aspect)), ch = nearbyint(sqrt(target / aspect));
            if (0 < cw && cw <= (double)w && 0 < ch && ch <= (double)h) {
                box.height = (long)ch, box.width = (long)cw;
                box.top = (long)(u[2] * (double)(h - box.height + 1)), box.left = (long)(u[3] * (double)(w - box.width + 1));
                return box;
            }
        }
        if (ratio < s->ratio_lo) { /* a central crop with the aspect clamped, as torchvision does */
            box.width = w, box.height = (long)nearbyint((double)w / s->ratio_lo);
        } else if (ratio > s->ratio_hi) {
            box.height = h, box.width = (long)nearbyint((double)h * s->ratio_hi);
        } else {
            box.height = h, box.width = w;
        }
        box.top = (h - box.height) / 2, box.left = (w - box.width) / 2;
        return box;
    }
}

/* per_image._dct_scale: the largest of 1, 2, 4, 8 at which the box keeps the output's pixels. */
static int dct_scale(const Spec *s, Box box) {
    int scale = 1;
    while (scale < 8 && box.height >= 2L * scale * s->out_h && box.width >= 2L * scale * s->out_w) scale *= 2;
    return scale;
}

/* The image's size from its frame header (any SOF), or 0 where there is none to find. */
static int jpeg_size(const unsigned char *d, size_t size, long *height, long *width) {
    size_t pos = 2;
    if (size < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    while (pos + 4 <= size && d[pos] == 0xFF) {
        unsigned marker = d[pos + 1], length = (unsigned)d[pos + 2] << 8 | d[pos + 3];
        if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
            if (length < 7 || pos + 9 > size) return 0;
            *height = (long)d[pos + 5] << 8 | d[pos + 6];
            *width = (long)d[pos + 7] << 8 | d[pos + 8];
            return *height > 0 && *width > 0;
        }
        if (marker == 0xDA || length < 2) return 0;
        pos += 2 + length;
    }
    return 0;
}

static int read_exactly(int fd, unsigned char *into, size_t size, off_t offset) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(fd, into + done, size - done, offset + (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

/* per_image._crop_resize: the box (full-resolution pixels) cut from `block`, the region decoded
 * at 1/scale whose top-left pixel is `origin` of the scaled image; halved while an axis shrinks 2x
 * or more, resized into `out`, flipped. The cut is clamped to the block as numpy's slice is. */
static int crop_resize(Pixels block, long origin_y, long origin_x, long scaled_h, long scaled_w, long h, long w, Box box,
                       int flip, Pixels out, Buffers *buffers) {
    double sy = (double)scaled_h / (double)h, sx = (double)scaled_w / (double)w;
    long y0 = (long)((double)box.top * sy), x0 = (long)((double)box.left * sx);
    long y1 = (long)nearbyint((double)(box.top + box.height) * sy), x1 = (long)nearbyint((double)(box.left + box.width) * sx);
    int turn = 0;
    if (y1 < y0 + 1) y1 = y0 + 1;
    if (x1 < x0 + 1) x1 = x0 + 1;
    y0 -= origin_y, y1 -= origin_y, x0 -= origin_x, x1 -= origin_x;
    if (y1 > block.height) y1 = block.height;
    if (x1 > block.width) x1 = block.width;
    if (y0 < 0 || x0 < 0 || y1 <= y0 || x1 <= x0) return -1; /* never for boxes inside the image */
    block.pixels += y0 * block.stride + x0 * 3;
    block.height = y1 - y0, block.width = x1 - x0;
    while (block.height >= 2 * out.height || block.width >= 2 * out.width) {
        long fy = block.height >= 2 * out.height ? 2 : 1, fx = block.width >= 2 * out.width ? 2 : 1;
        Pixels half = {NULL, block.height / fy, block.width / fx, (size_t)(block.width / fx) * 3};
        half.pixels = scratch_get(&buffers->halved[turn], (size_t)half.height * half.stride);
        if (half.pixels == NULL) return -1;
        block.height = half.height * fy, block.width = half.width * fx; /* an odd last row or column is dropped */
        if (resize_bilinear(block, half, &buffers->resize) != 0) return -1;
        block = half;
        turn = !turn;
    }
    if (resize_bilinear(block, out, &buffers->resize) != 0) return -1;
    if (flip) flip_columns(out);
    return 0;
}

/* per_image._resample_exact on the image `data` (h x w): decoded whole as simplejpeg's default
 * decode, resized as torchvision's Resize does with Pillow and cut (or padded) as CenterCrop does, flipped. */
static int exact_crop(const Spec *spec, const unsigned char *data, size_t size, long h, long w, int flip, Pixels out,
                      Buffers *buffers) {
    long new_h, new_w, top, left;
    Job job;

    exact_resize(spec, h, w, &new_h, &new_w, &top, &left);
    /* a resize to nothing (a very long, thin image) or a side over 2^20: the Python path reports it */
    if (!pillow_resize_fits(h, w, new_h, new_w, top, left, out.height, out.width, spec->filter, spec->passes))
        return NOT_DECODED;
    memset(&job, 0, sizeof job);
    job.data = data;
    job.size = size;
    job.height = h, job.width = w;
    job.scale = 1;
    job.exact = 1;
    job.max_pixels = spec->max_pixels;
    job.out_size = (size_t)h * (size_t)w * 3;
    job.out = scratch_get(&buffers->decode, job.out_size);
    if (job.out == NULL || region_decode(&job) != 0) return NOT_DECODED;
    if (pillow_resize_crop(job.out, h, w, new_h, new_w, top, left, spec->filter, spec->passes, out.pixels, out.height,
                           out.width) != 0)
        return NOT_DECODED;
    if (flip) flip_columns(out);
    return DONE;
}

/* One sample: read, check, decode its crop into `out`. */
static int decode_sample(const Spec *spec, int fd, uint64_t offset, uint64_t size, const uint64_t *checksum,
                         const double *tries, int flip, Pixels out, Buffers *buffers) {
    unsigned char *data;
    struct stat file;
    long h, w, scaled_h, scaled_w;
    int scale;
    Box box;
    Job job;

    /* A member past the file's end (a truncated shard; a damaged, unverified index: any 64-bit
     * offset and size) fails here, before its size is allocated or an offset overflows off_t. */
    if (fstat(fd, &file) != 0 || offset > (uint64_t)file.st_size || size > (uint64_t)file.st_size - offset)
        return READ_FAILED;
    data = scratch_get(&buffers->read, size ? (size_t)size : 1);
    if (data == NULL || read_exactly(fd, data, (size_t)size, (off_t)offset) != 0) return READ_FAILED;
    if (checksum && XXH3_64bits(data, (size_t)size) != *checksum) return READ_FAILED;
    if (!jpeg_size(data, (size_t)size, &h, &w) || (uint64_t)h * (uint64_t)w > spec->max_pixels) return NOT_DECODED;
    if (spec->exact || pads(spec, h, w)) return exact_crop(spec, data, (size_t)size, h, w, flip, out, buffers);
    box = crop_box(spec, h, w, tries);
    scale = dct_scale(spec, box);
    scaled_h = (h + scale - 1) / scale, scaled_w = (w + scale - 1) / scale;
    memset(&job, 0, sizeof job);
    job.data = data;
    job.size = (size_t)size;
    /* One source row and column past the box: the resize may round up to them. */
    job.top = box.top, job.left = box.left;
    job.height = h - box.top < box.height + scale ? h - box.top : box.height + scale;
    job.width = w - box.left < box.width + scale ? w - box.left : box.width + scale;
    job.scale = scale;
    job.max_pixels = spec->max_pixels;
    job.out_size = (size_t)scaled_h * (size_t)scaled_w * 3;
    job.out = scratch_get(&buffers->decode, job.out_size);
    if (spec->restarts) {
        job.strip_size = (size_t)size + STRIP_SLACK;
        job.strip = scratch_get(&buffers->strip, job.strip_size);
        if (job.strip == NULL) return NOT_DECODED;
    }
    if (job.out == NULL || region_decode(&job) != 0) return NOT_DECODED;
    {
        Pixels block = {job.out, (long)job.rows, (long)job.cols, (size_t)job.cols * 3};
        long origin_y = box.top / scale - (long)job.dy, origin_x = box.left / scale - (long)job.dx;
        if (crop_resize(block, origin_y, origin_x, scaled_h, scaled_w, h, w, box, flip, out, buffers) != 0) return NOT_DECODED;
    }
    return DONE;
}

/* Checks that `view` holds `count` items of `itemsize` bytes; else a ValueError naming it. */
static int check_items(const Py_buffer *view, const char *name, Py_ssize_t count, Py_ssize_t itemsize) {
    if (view->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "decode_chunk: %s has %zd bytes, %zd items of %zd expected", name, view->len, count,
                     itemsize);
        return -1;
    }
    return 0;
}

const char DECODE_CHUNK_DOC[] =
    "decode_chunk(fds, offsets, sizes, checksums, tries, flips, positions, spec, out, status, max_pixels) -> int\n\n"
    "Read, check, decode, crop, resize and flip m samples into their slots of `out` without the GIL.\n"
    "fds int32 (m,): open shard files; offsets, sizes uint64 (m,): each image member's bytes;\n"
    "checksums uint64 (m,) (their xxh3-64) or None not to check; tries float64 (m, 10, 4) and flips\n"
    "uint8 (m,): the crop draws (crops.draw_batch); positions int64 (m,): each sample's slot in out;\n"
    "spec (kind 0/1/2 = random_resized/center/resize, out_h, out_w, scale_lo, scale_hi, ratio_lo,\n"
    "ratio_hi, center_fraction, restarts, exact: per_image.py's exact path, Pillow's resize, filter: its\n"
    "index in crops.RESAMPLE_FILTERS, passes: per_image.PILLOW_PASSES); out: a\n"
    "writable (N, out_h, out_w, 3) uint8 buffer; status: a writable uint8 (m,) buffer, each sample's\n"
    "outcome (0 done, 1 read failed or checksum mismatch, 2 not decoded here); max_pixels: the pixel\n"
    "budget, a JPEG of more pixels by its header is not decoded here (status 2). Returns how many\n"
    "samples were done.";

PyObject *decode_chunk(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fds", "offsets", "sizes", "checksums", "tries", "flips", "positions", "spec", "out", "status",
                               "max_pixels", NULL};
    Py_buffer fds, offsets, sizes, checksums = {0}, tries, flips, positions, out, status;
    PyObject *checksums_obj;
    Spec spec;
    Py_ssize_t m, slots, i, slot_bytes;
    long done = 0;
    int ok = 0;

    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*y*Oy*y*y*(iiidddddppii)w*w*K:decode_chunk", keywords, &fds, &offsets,
                                     &sizes, &checksums_obj, &tries, &flips, &positions, &spec.kind, &spec.out_h, &spec.out_w,
                                     &spec.scale_lo, &spec.scale_hi, &spec.ratio_lo, &spec.ratio_hi, &spec.center_fraction,
                                     &spec.restarts, &spec.exact, &spec.filter, &spec.passes, &out, &status, &spec.max_pixels))
        return NULL;
    m = fds.len / 4;
    if (checksums_obj != Py_None && PyObject_GetBuffer(checksums_obj, &checksums, PyBUF_SIMPLE) != 0) goto release;
    if (check_items(&fds, "fds", m, 4) || check_items(&offsets, "offsets", m, 8) || check_items(&sizes, "sizes", m, 8) ||
        (checksums.obj && check_items(&checksums, "checksums", m, 8)) || check_items(&tries, "tries", m, 8 * 4 * CROP_TRIES) ||
        check_items(&flips, "flips", m, 1) || check_items(&positions, "positions", m, 8) || check_items(&status, "status", m, 1))
        goto release;
    /* a slot's bytes computed only where they fit Py_ssize_t */
    slot_bytes = spec.out_h > 0 && spec.out_w > 0 && spec.out_w <= PY_SSIZE_T_MAX / 3 / spec.out_h
                     ? (Py_ssize_t)spec.out_h * spec.out_w * 3 : 0;
    if (spec.kind < RANDOM_RESIZED || spec.kind > RESIZE || spec.filter < 0 || spec.filter >= FILTERS ||
        (spec.passes != PASSES_HORIZONTAL_FIRST && spec.passes != PASSES_PILLOW_13) || slot_bytes == 0 ||
        out.len % slot_bytes) {
        PyErr_Format(PyExc_ValueError, "decode_chunk: spec kind %d, filter %d, passes %d, %dx%d output, or out's %zd "
                     "bytes are not whole slots", spec.kind, spec.filter, spec.passes, spec.out_h, spec.out_w, out.len);
        goto release;
    }
    slots = out.len / slot_bytes;
    for (i = 0; i < m; i++) {
        int64_t slot = ((const int64_t *)positions.buf)[i];
        if (slot < 0 || slot >= slots) {
            PyErr_Format(PyExc_ValueError, "decode_chunk: position %lld is not a slot of out (%zd slots)", (long long)slot, slots);
            goto release;
        }
    }

    Py_BEGIN_ALLOW_THREADS
    Buffers buffers;
    memset(&buffers, 0, sizeof buffers);
    for (i = 0; i < m; i++) {
        int64_t slot = ((const int64_t *)positions.buf)[i];
        Pixels target = {(uint8_t *)out.buf + slot * slot_bytes, spec.out_h, spec.out_w, (size_t)spec.out_w * 3};
        uint8_t outcome = (uint8_t)decode_sample(&spec, ((const int32_t *)fds.buf)[i], ((const uint64_t *)offsets.buf)[i],
                                                 ((const uint64_t *)sizes.buf)[i],
                                                 checksums.obj ? (const uint64_t *)checksums.buf + i : NULL,
                                                 (const double *)tries.buf + i * 4 * CROP_TRIES, ((const uint8_t *)flips.buf)[i],
                                                 target, &buffers);
        ((uint8_t *)status.buf)[i] = outcome;
        done += outcome == DONE;
    }
    scratch_free(&buffers.read);
    scratch_free(&buffers.decode);
    scratch_free(&buffers.strip);
    scratch_free(&buffers.halved[0]);
    scratch_free(&buffers.halved[1]);
    scratch_free(&buffers.resize);
    Py_END_ALLOW_THREADS
    ok = 1;

release:
    PyBuffer_Release(&fds);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    if (checksums.obj) PyBuffer_Release(&checksums);
    PyBuffer_Release(&tries);
    PyBuffer_Release(&flips);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&out);
    PyBuffer_Release(&status);
    return ok ? PyLong_FromLong(done) : NULL;
}
