/* stoker.augment._photometric: ColorJitter (brightness, contrast, saturation, hue, in an order drawn per
   sample), RandomGrayscale, ToTensor's scaling to [0, 1] and Normalize for a chunk of decoded crops in one
   call that holds no GIL: what stoker.augment.Augment.apply_image computes per image with OpenCV and
   numpy (stoker/augment/color.py, cpu.py). Why: the Python path makes ~10 numpy/OpenCV calls per
   image, and the GIL is held between them (~210-250 us per 224x224 image measured on the Loader's
   threads), so the Loader's threads queued on it instead of scaling with the cores.

   This file is the Python module: every array's dtype, shape and layout checked before the GIL is
   released, the build chosen, the constants of photometric.h exported. The kernels and their
   arithmetic: photometric_kernels.c. */

#include "photometric.h"

#include <string.h>

/* The build named `name` (the fastest that runs here where NULL), or -1 with ValueError. */
static int find_build(const char *name) {
    int build;
    for (build = 0; build < PHOTOMETRIC_BUILD_COUNT; build++)
        if (photometric_build_runs_here(build) && (!name || !strcmp(name, PHOTOMETRIC_BUILD_NAMES[build])))
            return build;
    PyErr_Format(PyExc_ValueError, "build %s is not one this CPU runs (see BUILDS)", name);
    return -1;
}

/* ---- argument checks: every array's dtype, shape and layout, before the GIL is released ---- */

/* The bytes of one element of numpy's buffer format code (native sizes: LP64's long). */
static Py_ssize_t code_size(char code) {
    switch (code) {
    case 'B': return 1;
    case 'i': case 'f': return 4;
    case 'l': return sizeof(long);
    case 'q': case 'd': return 8;
    default: return 0;
    }
}

/* The buffer of argument `name`: C-contiguous, of `ndim` dimensions, its elements of one of the
   format `codes` (at their native size); ValueError saying what is wrong, `what` naming the dtype. */
static int get_array(PyObject *obj, Py_buffer *view, const char *name, int writable, int ndim, const char *codes,
                     Py_ssize_t size, const char *what) {
    const char *format;
    size_t length;
    char code;
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be %s array%s, got %.100s", name, what, writable ? " (writable)" : "",
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    format = view->format ? view->format : "B";
    length = strlen(format);
    code = length ? format[length - 1] : '?';
    if (length < 1 || length > 2 || (length == 2 && !strchr("@=", format[0])) || !strchr(codes, code) ||
        view->itemsize != code_size(code) || (size && view->itemsize != size)) {
        PyErr_Format(PyExc_ValueError, "%s must be %s array, got buffer format %s (%zd bytes)", name, what, format,
                     view->itemsize);
    } else if (view->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must have %d dimensions, got %d", name, ndim, view->ndim);
    } else if (!PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous", name);
    } else {
        return 1;
    }
    PyBuffer_Release(view);
    return 0;
}

static int check_dim(const Py_buffer *view, const char *name, int dim, Py_ssize_t expected, const char *meaning) {
    if (view->shape[dim] == expected)
        return 1;
    PyErr_Format(PyExc_ValueError, "%s's dimension %d must be %zd (%s), got %zd", name, dim, expected, meaning,
                 view->shape[dim]);
    return 0;
}

PyDoc_STRVAR(apply_chunk_doc,
             "apply_chunk(crops, out, ops, params, positions, *, build=None)\n--\n\n"
             "Put crop i of crops (uint8 (m, H, W, 3)) through the op codes ops[positions[i]] (int32 (N, L), in\n"
             "order) with their parameters params[positions[i]] (float64 (N, L, PARAMS)) into out[positions[i]]\n"
             "(float32 (N, H, W, 3), or uint8, rounded back), the bytes first scaled to [0, 1]. The GIL is\n"
             "released for the whole chunk. build: one of BUILDS (default: the fastest this CPU runs), all\n"
             "computing the same values. ValueError names a wrong dtype, shape, layout, position, op or build.");

static PyObject *apply_chunk(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"crops", "out", "ops", "params", "positions", "build", NULL};
    const char *name = NULL;
    int build;
    PyObject *objects[5];
    Py_buffer crops, out, ops, params, positions;
    int held = 0, floats = 0;
    Py_ssize_t count, slots, nops, i;
    Chunk c;
    PyObject *result = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$z", keywords, &objects[0], &objects[1], &objects[2],
                                     &objects[3], &objects[4], &name) ||
        (build = find_build(name)) < 0)
        return NULL;
    if (!get_array(objects[0], &crops, "crops", 0, 4, "B", 1, "a uint8"))
        return NULL;
    held = 1;
    if (!get_array(objects[1], &out, "out", 1, 4, "fB", 0, "a float32 or uint8"))
        goto done;
    floats = out.itemsize == 4;
    held = 2;
    if (!get_array(objects[2], &ops, "ops", 0, 2, "il", 4, "an int32"))
        goto done;
    held = 3;
    if (!get_array(objects[3], &params, "params", 0, 3, "d", 8, "a float64"))
        goto done;
    held = 4;
    if (!get_array(objects[4], &positions, "positions", 0, 1, "lq", 8, "an int64"))
        goto done;
    held = 5;
    count = crops.shape[0], slots = out.shape[0], nops = ops.shape[1];
    if (!check_dim(&crops, "crops", 3, 3, "RGB") || !check_dim(&out, "out", 1, crops.shape[1], "the crops' height") ||
        !check_dim(&out, "out", 2, crops.shape[2], "the crops' width") || !check_dim(&out, "out", 3, 3, "RGB") ||
        !check_dim(&ops, "ops", 0, slots, "out's slots") || !check_dim(&params, "params", 0, slots, "out's slots") ||
        !check_dim(&params, "params", 1, nops, "ops per slot") ||
        !check_dim(&params, "params", 2, PARAMS, "parameters per op") ||
        !check_dim(&positions, "positions", 0, count, "the crops"))
        goto done;
    for (i = 0; i < count; i++) {
        int64_t slot = ((const int64_t *)positions.buf)[i];
        if (slot < 0 || slot >= slots) {
            PyErr_Format(PyExc_ValueError, "positions[%zd] is %lld, not a slot of out (0..%zd)", i, (long long)slot,
                         slots - 1);
            goto done;
        }
    }
    for (i = 0; i < slots * nops; i++) {
        int32_t op = ((const int32_t *)ops.buf)[i];
        if (op < BRIGHTNESS || op > LAST_OP) {
            PyErr_Format(PyExc_ValueError, "ops[%zd, %zd] is %d, not an op code (%d..%d)", i / nops, i % nops, (int)op,
                         BRIGHTNESS, LAST_OP);
            goto done;
        }
    }
    c = (Chunk){crops.buf, floats ? out.buf : NULL, floats ? NULL : out.buf, ops.buf, params.buf, positions.buf,
                count, crops.shape[1], crops.shape[2], nops, NULL};
    if (count > 0 && c.height > 0 && c.width > 0) {
        c.work = floats ? NULL : PyMem_RawMalloc((size_t)c.height * c.width * 3 * sizeof(float));
        if (!floats && !c.work) {
            PyErr_NoMemory();
            goto freed;
        }
        Py_BEGIN_ALLOW_THREADS
        photometric_run(&c, build);
        Py_END_ALLOW_THREADS
    }
    Py_INCREF(Py_None);
    result = Py_None;
freed:
    PyMem_RawFree(c.work);
done:
    if (held >= 1)
        PyBuffer_Release(&crops);
    if (held >= 2)
        PyBuffer_Release(&out);
    if (held >= 3)
        PyBuffer_Release(&ops);
    if (held >= 4)
        PyBuffer_Release(&params);
    if (held >= 5)
        PyBuffer_Release(&positions);
    return result;
}

static PyMethodDef methods[] = {
    {"apply_chunk", (PyCFunction)(void (*)(void))apply_chunk, METH_VARARGS | METH_KEYWORDS, apply_chunk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_photometric",
    "ColorJitter, grayscale, ToTensor's scaling and Normalize for a chunk of crops, without the GIL (see _photometric.c).",
    -1, methods,
};

/* BUILDS: the names of the builds this CPU runs, fastest first. */
static PyObject *builds_here(void) {
    PyObject *names = PyTuple_New(0);
    int build;
    for (build = 0; names && build < PHOTOMETRIC_BUILD_COUNT; build++) {
        PyObject *name;
        if (!photometric_build_runs_here(build))
            continue;
        name = PyUnicode_FromString(PHOTOMETRIC_BUILD_NAMES[build]);
        if (!name || _PyTuple_Resize(&names, PyTuple_GET_SIZE(names) + 1) < 0) {
            Py_XDECREF(name);
            Py_XDECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, PyTuple_GET_SIZE(names) - 1, name);
    }
    return names;
}

/* Adds `value` (a new reference, or NULL with an error set) to `m` as `name`, and drops the reference. */
static int add_object(PyObject *m, const char *name, PyObject *value) {
    int added = value ? PyModule_AddObjectRef(m, name, value) : -1;
    Py_XDECREF(value);
    return added;
}

/* The module's constants: photometric.h's op codes, PARAMS and GRAY (each weight as the float32 the
   kernels use), for the Python side to check its own against; BUILDS. */
PyMODINIT_FUNC PyInit__photometric(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "BRIGHTNESS", BRIGHTNESS) < 0 ||
              PyModule_AddIntConstant(m, "CONTRAST", CONTRAST) < 0 ||
              PyModule_AddIntConstant(m, "SATURATION", SATURATION) < 0 || PyModule_AddIntConstant(m, "HUE", HUE) < 0 ||
              PyModule_AddIntConstant(m, "GRAYSCALE", GRAYSCALE) < 0 ||
              PyModule_AddIntConstant(m, "NORMALIZE", NORMALIZE) < 0 ||
              PyModule_AddIntConstant(m, "PARAMS", PARAMS) < 0 ||
              add_object(m, "GRAY", Py_BuildValue("(ddd)", (double)GRAY[0], (double)GRAY[1], (double)GRAY[2])) < 0 ||
              add_object(m, "BUILDS", builds_here()) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
