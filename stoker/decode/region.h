/* The region decode of _jpeg_region.c, shared with decode_chunk.c (both are compiled into the
 * stoker.decode._jpeg_region extension). Include after Python.h. */
#ifndef STOKER_REGION_H
#define STOKER_REGION_H

#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <jpeglib.h>

typedef struct {
    /* in */
    const unsigned char *data;
    size_t size;
    Py_ssize_t top, left, height, width;
    int scale;
    int exact; /* decoded as simplejpeg's default (per_image.py's exact path): the accurate IDCT and fancy
                  upsampling, the region the whole image at scale 1, read to its end (EOI) */
    uint64_t max_pixels; /* the pixel budget (stoker/pixels.py): a larger image, by its header, fails before
                            libjpeg allocates anything for its size */
    unsigned char *out;
    size_t out_size;
    unsigned char *strip; /* NULL, or where a strip JPEG may be built from the image's restart table */
    size_t strip_size;
    /* out */
    JDIMENSION rows, cols, dy, dx;
    int table_error; /* the message is about the restart table: damage to stoker's own data, never a decoder's quirk */
    char message[JMSG_LENGTH_MAX + 64];
} Job;

/* Decodes the region (top, left, height, width) of job->data at 1/job->scale into job->out (see
 * decode_region's docstring in _jpeg_region.c); 0, or -1 with job->message set. Needs no GIL. */
int region_decode(Job *job);

/* decode_chunk(...): the Python function of decode_chunk.c, registered by _jpeg_region.c. */
PyObject *decode_chunk(PyObject *self, PyObject *args, PyObject *kwargs);
extern const char DECODE_CHUNK_DOC[];

#endif
