/* Region-of-interest JPEG decode on the CPU, with libjpeg-turbo's libjpeg API.
 *
 * A RandomResizedCrop often keeps a fraction of the image, yet a full decode runs the IDCT,
 * upsampling and colour conversion on every pixel. libjpeg-turbo can do less:
 *   - scale_num/scale_denom: IDCT straight to 1/2, 1/4 or 1/8 size;
 *   - jpeg_skip_scanlines(): rows above the region are entropy-decoded only (no IDCT, no colour);
 *   - jpeg_crop_scanline(): only the iMCU columns covering the region go through IDCT/colour;
 *   - stopping after the region's last row: the rest of the file is never read;
 *   - in files from `stoker pack --restart-rows`, restart markers: only the MCU rows and restart
 *     intervals around the region are entropy-decoded at all (make_strip below).
 * No Python binding of the libjpeg-turbo 2.1 shipped by Debian exposes this, hence this module.
 *
 * decode_region(data, top, left, height, width, scale_denom, out, strip=None, *, max_pixels) -> (rows, cols, dy, dx)
 * writes an RGB block of rows x cols pixels (stride cols*3) into `out` that covers the region
 * (given in full-resolution pixels) at 1/scale_denom; the region starts at (dy, dx) in the block.
 * Errors, and libjpeg warnings (corrupt or truncated data), raise ValueError, as does an image
 * of more than max_pixels pixels (the pixel budget, stoker/pixels.py), before it is decoded.
 * LIBJPEG_TURBO_VERSION (str) and JPEG_LIB_VERSION (int) name the libjpeg-turbo it was compiled against.
 *
 * All libjpeg work runs in decode() without the GIL; its setjmp/longjmp never leave decode(),
 * so no longjmp crosses Py_BEGIN/END_ALLOW_THREADS. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <jpeglib.h>

#include "../_jpeg_strict.h"
#include "region.h"


static PyObject *RestartTableError;

/* The restart table that `stoker pack --restart-rows` puts in an APP9 segment before SOS (written
 * by stoker/pack/_jpeg_restart.c, specified in docs/format.md): after "StokerRST\0" and a version
 * byte, (rows + 1) uint32 LE offsets of each MCU row's first entropy-coded byte from the start of
 * the scan's data (the last: the EOI marker), then rows x (groups - 1) uint16 LE offsets of the
 * further restart intervals of each row from the row's first byte. */
static const char TABLE_ID[] = "StokerRST";
#define TABLE_HEADER 11

typedef struct {
    const unsigned char *rows;      /* uint32 LE x (row_count + 1) */
    const unsigned char *intervals; /* uint16 LE x row_count x (groups - 1) */
    unsigned row_count, groups;
    size_t scan; /* where the scan's data starts in the file */
} Table;

static unsigned read16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

static void write16(unsigned char *p, unsigned value) {
    p[0] = (unsigned char)(value >> 8);
    p[1] = (unsigned char)value;
}

/* Where restart interval i (rows x groups of them, numbered row by row; i = the count: the end of
 * the scan) starts in the file. */
static size_t interval_start(const Table *t, size_t i) {
    size_t row = i / t->groups, group = i % t->groups;
    const unsigned char *p = t->rows + 4 * row;
    size_t at = t->scan + ((size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24);
    if (group) {
        p = t->intervals + 2 * (row * (t->groups - 1) + group - 1);
        at += (size_t)p[0] | (size_t)p[1] << 8;
    }
    return at;
}

#define STRIP_FAIL(...) \
    do { snprintf(job->message, sizeof job->message, __VA_ARGS__); job->table_error = 1; return -1; } while (0)

/* Where the image has a restart table, replaces job->data with a strip JPEG holding only the MCU
 * rows, and in each row the restart intervals, that cover the region, and moves the region into
 * the strip's coordinates; an image without one is left as it is. The strip is the header with
 * the frame's size patched, the chosen intervals' entropy-coded bytes with the restart markers
 * between them renumbered from RST0 (libjpeg checks the sequence), and EOI. Each marker the strip
 * relies on must be where the table says, so a damaged table or scan is an error, never other
 * rows. Every pixel comes out as in a decode of the whole file: with the fast IDCT and no fancy
 * upsampling, each depends only on its own MCU (see _decode_region in per_image.py). */
static int make_strip(Job *job) {
    const unsigned char *d = job->data, *table = NULL;
    size_t pos = 2, sof = 0, table_length = 0, end, total, i, out;
    unsigned height = 0, width = 0, interval = 0, mcu_w = 8, mcu_h = 8, per_row, count = 0;
    unsigned r0, r1, g0, g1, r, components = 0, scan_components = 0;
    Table t;

    if (job->size < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0; /* not a JPEG: libjpeg says so below */
    for (;;) { /* the header's segments, up to the start of the scan */
        unsigned marker, length;
        if (pos + 4 > job->size || d[pos] != 0xFF) return 0; /* libjpeg reports a malformed header */
        marker = d[pos + 1];
        length = read16(d + pos + 2);
        if (length < 2 || pos + 2 + length > job->size) return 0;
        if (marker == 0xC0 || marker == 0xC1) { /* baseline or extended sequential, Huffman */
            unsigned c, hmax = 1, vmax = 1;
            if (length < 8) return 0;
            sof = pos;
            height = read16(d + pos + 5);
            width = read16(d + pos + 7);
            components = d[pos + 9];
            if (d[pos + 4] != 8 || length != 8 + 3 * components) sof = 0;
            for (c = 0; sof && c < components; c++) {
                unsigned h = d[pos + 11 + 3 * c] >> 4, v = d[pos + 11 + 3 * c] & 15;
                if (h > hmax) hmax = h;
                if (v > vmax) vmax = v;
            }
            if (components > 1) { /* interleaved: an MCU covers each component's blocks */
                mcu_w = 8 * hmax;
                mcu_h = 8 * vmax;
            }
        } else if (marker == 0xDD && length == 4) {
            interval = read16(d + pos + 4);
        } else if (marker == 0xE9 && length - 2 >= TABLE_HEADER && memcmp(d + pos + 4, TABLE_ID, sizeof TABLE_ID) == 0) {
            table = d + pos + 4;
            table_length = length - 2;
        } else if (marker == 0xDA) {
            scan_components = length >= 3 ? d[pos + 4] : 0;
            pos += 2 + length;
            break;
        }
        pos += 2 + length;
    }
    if (!table) return 0;
    if (!sof || !height || !width || scan_components != components)
        STRIP_FAIL("restart table in a JPEG without one sequential, 8-bit scan of every component");
    t.scan = pos;
    per_row = (width + mcu_w - 1) / mcu_w;
    t.row_count = (height + mcu_h - 1) / mcu_h;
    if (!interval || per_row % interval)
        STRIP_FAIL("restart interval %u does not divide the %u MCUs of a row", interval, per_row);
    t.groups = per_row / interval;
    total = (size_t)t.row_count * t.groups;
    if (table[TABLE_HEADER - 1] != 1 ||
        table_length != TABLE_HEADER + 4 * ((size_t)t.row_count + 1) + 2 * (size_t)t.row_count * (t.groups - 1))
        STRIP_FAIL("restart table does not match the image (%zu bytes for %u rows of %u intervals, version %u)",
                   table_length, t.row_count, t.groups, table[TABLE_HEADER - 1]);
    t.rows = table + TABLE_HEADER;
    t.intervals = t.rows + 4 * ((size_t)t.row_count + 1);
    end = interval_start(&t, total);
    if (end + 2 > job->size || d[end] != 0xFF || d[end + 1] != 0xD9)
        STRIP_FAIL("restart table: the scan does not end where it says");
    if (interval_start(&t, 0) != t.scan) STRIP_FAIL("restart table: the scan does not start where it says");
    if (job->top < 0 || job->left < 0 || job->height <= 0 || job->width <= 0 ||
        job->height > (Py_ssize_t)height - job->top || job->width > (Py_ssize_t)width - job->left)
        return 0; /* decode() reports the region */

    r0 = (unsigned)(job->top / mcu_h);
    r1 = (unsigned)((job->top + job->height - 1) / mcu_h);
    g0 = (unsigned)(job->left / mcu_w) / interval;
    g1 = (unsigned)((job->left + job->width - 1) / mcu_w) / interval + 1;
    if (r0 == 0 && g0 == 0 && g1 == t.groups) return 0; /* the file itself: the decode stops after row r1 */

    if (job->strip_size < t.scan + 2)
        STRIP_FAIL("strip buffer has %zu bytes, the header alone needs %zu", job->strip_size, t.scan + 2);
    memcpy(job->strip, d, t.scan);
    out = t.scan;
    write16(job->strip + sof + 5, r1 == t.row_count - 1 ? height - r0 * mcu_h : (r1 - r0 + 1) * mcu_h);
    write16(job->strip + sof + 7, g1 == t.groups ? width - g0 * interval * mcu_w : (g1 - g0) * interval * mcu_w);
    for (r = r0; r <= r1; r++) {
        size_t first = (size_t)r * t.groups + g0, last = (size_t)r * t.groups + g1; /* intervals [first, last) */
        size_t from = interval_start(&t, first), to = last < total ? interval_start(&t, last) - 2 : end, previous = 0;
        for (i = first; i <= last && i < total; i++) { /* each marker used must be where the table says, in order */
            size_t at = interval_start(&t, i);
            if (at > end || (i > first && at < previous + 2) ||
                (i > 0 && (at < t.scan + 2 || d[at - 2] != 0xFF || d[at - 1] != 0xD0 + (i - 1) % 8)))
                STRIP_FAIL("restart table: interval %zu does not start after restart marker %zu", i, (i - 1) % 8);
            previous = at;
        }
        if (to < from) STRIP_FAIL("restart table: interval %zu ends before it starts", first);
        if (out + (to - from) + 4 > job->strip_size)
            STRIP_FAIL("strip buffer has %zu bytes, too few for the region", job->strip_size);
        memcpy(job->strip + out, d + from, to - from);
        for (i = first + 1; i < last; i++) /* the markers inside the copied span */
            job->strip[out + (interval_start(&t, i) - from) - 1] = (unsigned char)(0xD0 + count++ % 8);
        out += to - from;
        job->strip[out++] = 0xFF;
        job->strip[out++] = r < r1 ? (unsigned char)(0xD0 + count++ % 8) : 0xD9;
    }
    job->data = job->strip;
    job->size = out;
    job->top -= (Py_ssize_t)r0 * mcu_h;
    job->left -= (Py_ssize_t)g0 * interval * mcu_w;
    return 0;
}

/* Decodes job->data into job->out; returns 0, or -1 with job->message set. Runs without the GIL
 * (also called by decode_chunk.c, once per sample of a chunk). */
int region_decode(Job *job) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    JDIMENSION y0, y1, x0, x1, xoff, cw;
    size_t stride;

    if (job->strip && make_strip(job) != 0) return -1;
    cinfo.err = strict_errors(&err);
    if (setjmp(err.jump)) { /* libjpeg failed below: cinfo.err holds the message */
        err.pub.format_message((j_common_ptr)&cinfo, job->message);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    /* jpeg_mem_src raises "Empty input buffer" for size 0, and at the end of data inserts an EOI
     * with a warning (JWRN_JPEG_EOF), which on_message turns into an error. */
    jpeg_mem_src(&cinfo, job->data, (unsigned long)job->size);
    jpeg_read_header(&cinfo, TRUE);

    /* before jpeg_start_decompress, which allocates for the whole image (a progressive file's every coefficient) */
    if ((uint64_t)cinfo.image_width * cinfo.image_height > job->max_pixels) {
        snprintf(job->message, sizeof job->message, "decompression bomb: %ux%u = %llu pixels, above the limit of %llu",
                 (unsigned)cinfo.image_width, (unsigned)cinfo.image_height,
                 (unsigned long long)cinfo.image_width * cinfo.image_height, (unsigned long long)job->max_pixels);
        goto fail;
    }
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        snprintf(job->message, sizeof job->message, "CMYK/YCCK JPEG cannot be decoded to RGB");
        goto fail;
    }
    if (job->top < 0 || job->left < 0 || job->height <= 0 || job->width <= 0 ||
        job->height > (Py_ssize_t)cinfo.image_height - job->top || /* no overflow */
        job->width > (Py_ssize_t)cinfo.image_width - job->left) {
        snprintf(job->message, sizeof job->message,
                 "region (top=%zd, left=%zd, height=%zd, width=%zd) is not inside the %ux%u image",
                 job->top, job->left, job->height, job->width,
                 (unsigned)cinfo.image_height, (unsigned)cinfo.image_width);
        goto fail;
    }

    cinfo.out_color_space = JCS_RGB; /* converts grayscale and YCbCr sources too */
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned)job->scale;
    if (job->exact) { /* simplejpeg's (and Pillow's) defaults: libjpeg's */
        cinfo.dct_method = JDCT_ISLOW;
        cinfo.do_fancy_upsampling = TRUE;
    } else {
        cinfo.dct_method = JDCT_IFAST;     /* simplejpeg's fastdct */
        cinfo.do_fancy_upsampling = FALSE; /* simplejpeg's fastupsample: chroma pixels replicated */
    }
    jpeg_start_decompress(&cinfo);       /* progressive files: reads all scans here */

    /* The region at 1/scale, widened to whole pixels; output_* = ceil(image_* / scale). */
    y0 = (JDIMENSION)(job->top / job->scale);
    y1 = (JDIMENSION)((job->top + job->height + job->scale - 1) / job->scale);
    x0 = (JDIMENSION)(job->left / job->scale);
    x1 = (JDIMENSION)((job->left + job->width + job->scale - 1) / job->scale);
    if (y1 > cinfo.output_height) y1 = cinfo.output_height;
    if (x1 > cinfo.output_width) x1 = cinfo.output_width;

    /* Moves xoff left to an iMCU column boundary and widens cw to match; output_width becomes cw. */
    xoff = x0;
    cw = x1 - x0;
    /* A crop that leaves a component under 2 samples wide makes jpeg_crop_scanline() re-initialize
     * the upsampler in place; with the merged upsampler (h2v1/h2v2 YCbCr without fancy upsampling,
     * ours) it writes a separate upsampler's fields over it and the memory after it: libjpeg-turbo
     * 2.1.5's C colour tables, which its plain-C path then reads (a segfault; SIMD builds read other
     * tables). Such narrow regions (a few pixels) decode the full width instead. */
    if (cw <= 2 * (JDIMENSION)cinfo.max_h_samp_factor) {
        xoff = 0;
        cw = cinfo.output_width;
    }
    jpeg_crop_scanline(&cinfo, &xoff, &cw);
    job->rows = y1 - y0;
    job->cols = cinfo.output_width;
    job->dy = 0; /* rows are skipped exactly */
    job->dx = x0 - xoff;
    stride = (size_t)job->cols * 3;
    if ((size_t)job->rows * stride > job->out_size) {
        snprintf(job->message, sizeof job->message,
                 "out has %zu bytes, the %ux%u RGB block needs %zu",
                 job->out_size, (unsigned)job->rows, (unsigned)job->cols, (size_t)job->rows * stride);
        goto fail;
    }

    if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
    while (cinfo.output_scanline < y1) {
        JSAMPROW rowptrs[16];
        JDIMENSION n = y1 - cinfo.output_scanline, i;
        if (n > 16) n = 16;
        for (i = 0; i < n; i++)
            rowptrs[i] = job->out + (size_t)(cinfo.output_scanline - y0 + i) * stride;
        jpeg_read_scanlines(&cinfo, rowptrs, n);
    }
    /* Rows below the region are never decoded: destroy (which aborts) instead of finishing. An exact
     * decode reads on to EOI as simplejpeg's does, so what it warns about there fails here too. */
    if (job->exact) jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return 0;

fail:
    jpeg_destroy_decompress(&cinfo);
    return -1;
}

static PyObject *decode_region(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "top", "left", "height", "width", "scale_denom", "out", "strip", "max_pixels", NULL};
    Py_buffer data, out, strip = {0};
    Job job;
    int rc;

    (void)self;
    memset(&job, 0, sizeof job);
    job.max_pixels = UINT64_MAX;
    /* y*: any read-only contiguous buffer; w*: a writable one. All are held (and a bytearray
     * cannot be resized) until PyBuffer_Release, so libjpeg may use them without the GIL. */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nnnniw*|w*$K:decode_region", keywords, &data, &job.top,
                                     &job.left, &job.height, &job.width, &job.scale, &out, &strip, &job.max_pixels))
        return NULL;
    if (job.scale != 1 && job.scale != 2 && job.scale != 4 && job.scale != 8) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        if (strip.obj) PyBuffer_Release(&strip);
        return PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, not %d", job.scale);
    }
    job.data = data.buf;
    job.size = (size_t)data.len;
    job.out = out.buf;
    job.out_size = (size_t)out.len;
    if (strip.obj) {
        job.strip = strip.buf;
        job.strip_size = (size_t)strip.len;
    }

    Py_BEGIN_ALLOW_THREADS
    rc = region_decode(&job);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (strip.obj) PyBuffer_Release(&strip);
    if (rc != 0) return PyErr_Format(job.table_error ? RestartTableError : PyExc_ValueError, "%s", job.message);
    return Py_BuildValue("(IIII)", (unsigned)job.rows, (unsigned)job.cols, (unsigned)job.dy,
                         (unsigned)job.dx);
}

static PyMethodDef methods[] = {
    {"decode_region", (PyCFunction)(void (*)(void))decode_region, METH_VARARGS | METH_KEYWORDS,
     "decode_region(data, top, left, height, width, scale_denom, out, strip=None, *, max_pixels=2**64-1)\n"
     "-> (rows, cols, dy, dx)\n\n"
     "Decode the region (top, left, height, width), in full-resolution pixels, of the JPEG `data`\n"
     "scaled by 1/scale_denom (1, 2, 4, 8) into `out` as RGB: a block of rows x cols pixels, rows\n"
     "packed (stride cols*3), covering rows floor(top/s)..ceil((top+height)/s) and the iMCU columns\n"
     "around the region's columns; the scaled region's top-left is at (dy, dx) in the block.\n"
     "ceil(H/s)*ceil(W/s)*3 bytes of `out` always suffice. Uses the fast integer IDCT and no fancy\n"
     "upsampling, as simplejpeg's fastdct/fastupsample. Raises ValueError on errors, on corrupt or\n"
     "truncated data, CMYK/YCCK sources, regions outside the image, too small `out`, and images of\n"
     "more than `max_pixels` pixels by their header (before anything is allocated for them).\n"
     "With `strip` (a writable buffer of len(data) + 64 bytes), a JPEG with the restart table of\n"
     "`stoker pack --restart-rows` is decoded from a strip JPEG of the MCU rows and restart\n"
     "intervals around the region, built there: the same pixels, less entropy decoding. A restart\n"
     "table that does not match the file raises ValueError."},
    {"decode_chunk", (PyCFunction)(void (*)(void))decode_chunk, METH_VARARGS | METH_KEYWORDS, DECODE_CHUNK_DOC},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg_region",
    "Region-of-interest JPEG decode with libjpeg-turbo (skip/crop scanlines, DCT scaling).", -1, methods,
};

/* jconfig.h defines LIBJPEG_TURBO_VERSION as bare tokens (2.1.5): made a string here. */
#define STRINGIFY_TOKENS(x) #x
#define STRINGIFY(x) STRINGIFY_TOKENS(x)

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    RestartTableError = PyErr_NewExceptionWithDoc(
        "stoker.decode._jpeg_region.RestartTableError",
        "A JPEG's restart table (stoker pack --restart-rows) does not match its scan: damaged data.", PyExc_ValueError, NULL);
    if (RestartTableError == NULL || PyModule_AddObjectRef(m, "RestartTableError", RestartTableError) < 0 ||
        PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION", STRINGIFY(LIBJPEG_TURBO_VERSION)) < 0 ||
        PyModule_AddIntConstant(m, "JPEG_LIB_VERSION", JPEG_LIB_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
