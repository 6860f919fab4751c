/* stoker.decode._resample: resize_crop, Pillow's antialiased resize cut to a crop, for
   the per-image exact path (per_image.py). The arithmetic is pillow_resample.c's, which
   decode_chunk.c's exact crops share; this file is its Python binding. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pillow_resample.h"

PyDoc_STRVAR(resize_crop_doc,
"resize_crop(src, height, width, resized_height, resized_width, top, left, out, out_height, out_width, filter,\n"
"            passes)\n"
"\n"
"Resize the RGB image ``src`` (height x width x 3 bytes, C order) to resized_height x resized_width\n"
"with Pillow's antialiased ``filter`` (an index of crops.RESAMPLE_FILTERS: 0 bilinear, 1 bicubic, 2 Lanczos,\n"
"3 Hamming, 4 box), its two passes in the order ``passes`` says (0: horizontal first, as Pillow before 13;\n"
"1: as Pillow 13; per_image.PILLOW_PASSES), and write the out_height x out_width part whose top-left\n"
"pixel is (top, left) into\n"
"``out``: the bytes of Pillow's ``resize`` then ``crop``, 0 where the crop lies outside the resize (what\n"
"CenterCrop pads; top and left may be negative). The GIL is released.");

static PyObject *resize_crop(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    int height, width, resized_h, resized_w, top, left, out_h, out_w, filter, passes, rc = -1;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiiiiw*iiii", &src, &height, &width, &resized_h, &resized_w, &top, &left, &out,
                          &out_h, &out_w, &filter, &passes))
        return NULL;
    if (!pillow_resize_fits(height, width, resized_h, resized_w, top, left, out_h, out_w, filter, passes)) {
        PyErr_Format(PyExc_ValueError, "resize_crop: a %dx%d crop at (%d, %d) of a %dx%d resize of a %dx%d image "
                     "with filter %d, passes %d", out_h, out_w, top, left, resized_h, resized_w, height, width, filter,
                     passes);
        goto done;
    }
    if (src.len < (Py_ssize_t)height * width * 3 || out.len < (Py_ssize_t)out_h * out_w * 3) {
        PyErr_Format(PyExc_ValueError, "resize_crop: buffers of %zd and %zd bytes for a %dx%d image and a %dx%d output",
                     src.len, out.len, height, width, out_h, out_w);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = pillow_resize_crop(src.buf, height, width, resized_h, resized_w, top, left, filter, passes, out.buf, out_h, out_w);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        PyErr_NoMemory(); /* the sizes were checked above */
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resize_crop", resize_crop, METH_VARARGS, resize_crop_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_resample", "Pillow's antialiased resize, cut to a crop (see pillow_resample.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__resample(void) {
    return PyModule_Create(&module);
}
