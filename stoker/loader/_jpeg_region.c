/* Region-of-interest JPEG decode on the CPU, with libjpeg-turbo's libjpeg API.
 *
 * A RandomResizedCrop often keeps a fraction of the image, yet a full decode runs the IDCT,
 * upsampling and colour conversion on every pixel. libjpeg-turbo can do less:
 *   - scale_num/scale_denom: IDCT straight to 1/2, 1/4 or 1/8 size;
 *   - jpeg_skip_scanlines(): rows above the region are entropy-decoded only (no IDCT, no colour);
 *   - jpeg_crop_scanline(): only the iMCU columns covering the region go through IDCT/colour;
 *   - stopping after the region's last row: the rest of the file is never read.
 * No Python binding of the libjpeg-turbo 2.1 shipped by Debian exposes this, hence this module.
 *
 * decode_region(data, top, left, height, width, scale_denom, out) -> (rows, cols, dy, dx)
 * writes an RGB block of rows x cols pixels (stride cols*3) into `out` that covers the region
 * (given in full-resolution pixels) at 1/scale_denom; the region starts at (dy, dx) in the block.
 * Errors, and libjpeg warnings (corrupt or truncated data), raise ValueError.
 * LIBJPEG_TURBO_VERSION (str) and JPEG_LIB_VERSION (int) name the libjpeg-turbo it was compiled against.
 *
 * All libjpeg work runs in decode() without the GIL; its setjmp/longjmp never leave decode(),
 * so no longjmp crosses Py_BEGIN/END_ALLOW_THREADS. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} ErrorManager;

/* libjpeg's default error_exit calls exit(); jump back into decode() instead. The message is
 * formatted in decode() from cinfo->err, which keeps msg_code and msg_parm. */
static void on_error(j_common_ptr cinfo) {
    longjmp(((ErrorManager *)cinfo->err)->jump, 1);
}

/* level -1 is a warning: corrupt data, or premature end of data, which libjpeg would pad with
 * gray. Be strict and treat it as an error; levels >= 0 are trace messages, ignored. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) longjmp(((ErrorManager *)cinfo->err)->jump, 1);
}

typedef struct {
    /* in */
    const unsigned char *data;
    size_t size;
    Py_ssize_t top, left, height, width;
    int scale;
    unsigned char *out;
    size_t out_size;
    /* out */
    JDIMENSION rows, cols, dy, dx;
    char message[JMSG_LENGTH_MAX + 64];
} Job;

/* Decodes job->data into job->out; returns 0, or -1 with job->message set. Runs without the GIL. */
static int decode(Job *job) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    JDIMENSION y0, y1, x0, x1, xoff, cw;
    size_t stride;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
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
    cinfo.dct_method = JDCT_IFAST;       /* simplejpeg's fastdct */
    cinfo.do_fancy_upsampling = FALSE;   /* simplejpeg's fastupsample: chroma pixels replicated */
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
    /* Rows below the region are never decoded: destroy (which aborts) instead of finishing. */
    jpeg_destroy_decompress(&cinfo);
    return 0;

fail:
    jpeg_destroy_decompress(&cinfo);
    return -1;
}

static PyObject *decode_region(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "top", "left", "height", "width", "scale_denom", "out", NULL};
    Py_buffer data, out;
    Job job;
    int rc;

    (void)self;
    memset(&job, 0, sizeof job);
    /* y*: any read-only contiguous buffer; w*: a writable one. Both are held (and a bytearray
     * cannot be resized) until PyBuffer_Release, so libjpeg may use them without the GIL. */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nnnniw*:decode_region", keywords, &data,
                                     &job.top, &job.left, &job.height, &job.width, &job.scale, &out))
        return NULL;
    if (job.scale != 1 && job.scale != 2 && job.scale != 4 && job.scale != 8) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, not %d", job.scale);
    }
    job.data = data.buf;
    job.size = (size_t)data.len;
    job.out = out.buf;
    job.out_size = (size_t)out.len;

    Py_BEGIN_ALLOW_THREADS
    rc = decode(&job);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (rc != 0) return PyErr_Format(PyExc_ValueError, "%s", job.message);
    return Py_BuildValue("(IIII)", (unsigned)job.rows, (unsigned)job.cols, (unsigned)job.dy,
                         (unsigned)job.dx);
}

static PyMethodDef methods[] = {
    {"decode_region", (PyCFunction)(void (*)(void))decode_region, METH_VARARGS | METH_KEYWORDS,
     "decode_region(data, top, left, height, width, scale_denom, out) -> (rows, cols, dy, dx)\n\n"
     "Decode the region (top, left, height, width), in full-resolution pixels, of the JPEG `data`\n"
     "scaled by 1/scale_denom (1, 2, 4, 8) into `out` as RGB: a block of rows x cols pixels, rows\n"
     "packed (stride cols*3), covering rows floor(top/s)..ceil((top+height)/s) and the iMCU columns\n"
     "around the region's columns; the scaled region's top-left is at (dy, dx) in the block.\n"
     "ceil(H/s)*ceil(W/s)*3 bytes of `out` always suffice. Uses the fast integer IDCT and no fancy\n"
     "upsampling, as simplejpeg's fastdct/fastupsample. Raises ValueError on errors, on corrupt or\n"
     "truncated data, CMYK/YCCK sources, regions outside the image and too small `out`."},
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
    if (PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION", STRINGIFY(LIBJPEG_TURBO_VERSION)) < 0 ||
        PyModule_AddIntConstant(m, "JPEG_LIB_VERSION", JPEG_LIB_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
