/* Lossless transcode of a sequential JPEG into one whose restart markers let a reader start at
 * any MCU row (and at a few places inside each row), with libjpeg-turbo's libjpeg API.
 *
 * transcode(data) -> bytes: the same DCT coefficients, quantization tables, sampling and APPn/COM
 * segments (copied byte for byte, in order), re-entropy-coded with a restart interval that
 * divides each MCU row into whole intervals, plus an APP9 "StokerRST" segment just before SOS
 * listing where each interval's entropy-coded data starts (docs/format.md, "Restart tables").
 * A reader finds that table by walking the header's segments, never by scanning the scan data.
 *
 * Every output is checked before it is returned: read back by libjpeg, its frame, quantization
 * tables, colour-space markers and every coefficient block must equal the source's; then any
 * decoder, at any settings, decodes both files to the same pixels. A reader needs ~1 ms per
 * 500x375 photo for the two entropy decodes and one encode (see docs/architecture.md).
 *
 * Raises NotTranscodable (a ValueError) with the reason for files this does not transcode
 * (progressive, arithmetic-coded, 12-bit, CMYK/YCCK, larger than allowed) and ValueError for
 * files libjpeg cannot read cleanly (its warnings count as errors). All libjpeg work runs
 * without the GIL; its setjmp/longjmp never leave the function that set them. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "../_jpeg_strict.h"

#define TABLE_MARKER (JPEG_APP0 + 9)
static const char TABLE_ID[] = "StokerRST"; /* with its NUL: 10 bytes, then a version byte */
#define TABLE_VERSION 1
#define TABLE_HEADER 11
/* Narrower intervals saved little more decode time (rough, sample photos: 32 px ~540 against
 * 64 px ~560 us per crop) for twice the markers (+2.1% against +1.0% before the table). */
#define MIN_INTERVAL_PIXELS 64

static PyObject *NotTranscodable;

typedef struct {
    /* in */
    const unsigned char *data;
    size_t size;
    double max_growth; /* the output may be at most size * (1 + max_growth) bytes */
    /* out */
    unsigned char *out; /* malloc'ed; freed by the caller, also after an error */
    size_t out_size, capacity;
    int not_transcodable;
    char message[JMSG_LENGTH_MAX + 96];
} Job;

typedef struct { /* the MCU grid of the output's single interleaved scan */
    unsigned per_row, rows, interval;
} Grid;

static int is_table(const unsigned char *segment, size_t length) {
    return length >= TABLE_HEADER && memcmp(segment, TABLE_ID, sizeof TABLE_ID) == 0;
}

/* The DC table codes every difference category of 8-bit data, so restarts (which code a whole DC
 * value where the source coded a difference) need no new codes; AC symbols do not change. */
static int dc_table_complete(const JHUFF_TBL *table) {
    int seen[16] = {0}, i, n = 0;
    if (!table) return 0;
    for (i = 1; i <= 16; i++) n += table->bits[i];
    for (i = 0; i < n && i < 256; i++)
        if (table->huffval[i] < 16) seen[table->huffval[i]] = 1;
    for (i = 0; i <= 11; i++)
        if (!seen[i]) return 0;
    return 1;
}

static void copy_huff_table(j_compress_ptr dst, JHUFF_TBL **slot, const JHUFF_TBL *table) {
    if (!table) return;
    if (!*slot) *slot = jpeg_alloc_huff_table((j_common_ptr)dst);
    memcpy((*slot)->bits, table->bits, sizeof table->bits);
    memcpy((*slot)->huffval, table->huffval, sizeof table->huffval);
    (*slot)->sent_table = FALSE;
}

/* libjpeg writes into job->out, grown as needed; unlike jpeg_mem_dest's buffer, the job owns it
 * at every moment, so nothing leaks when libjpeg fails halfway. */
typedef struct {
    struct jpeg_destination_mgr pub;
    Job *job;
} Destination;

static void destination_init(j_compress_ptr cinfo) {
    Destination *dest = (Destination *)cinfo->dest;
    Job *job = dest->job;
    job->capacity = job->size + job->size / 8 + 4096; /* usually enough for the whole file */
    job->out = malloc(job->capacity);
    if (!job->out) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 0);
    dest->pub.next_output_byte = job->out;
    dest->pub.free_in_buffer = job->capacity;
}

static boolean destination_grow(j_compress_ptr cinfo) {
    Destination *dest = (Destination *)cinfo->dest;
    Job *job = dest->job;
    unsigned char *bigger = realloc(job->out, 2 * job->capacity);
    if (!bigger) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 1);
    job->out = bigger;
    dest->pub.next_output_byte = bigger + job->capacity; /* libjpeg empties a full buffer only */
    dest->pub.free_in_buffer = job->capacity;
    job->capacity *= 2;
    return TRUE;
}

static void destination_term(j_compress_ptr cinfo) {
    Destination *dest = (Destination *)cinfo->dest;
    dest->job->out_size = dest->job->capacity - dest->pub.free_in_buffer;
}

/* Encodes the coefficients of `src` with `interval` MCUs per restart into job->out. */
static void encode(j_decompress_ptr src, jvirt_barray_ptr *coefs, unsigned interval, j_compress_ptr dst, Job *job) {
    Destination dest;
    jpeg_saved_marker_ptr marker;
    int i, source_tables = 1;

    dest.pub.init_destination = destination_init;
    dest.pub.empty_output_buffer = destination_grow;
    dest.pub.term_destination = destination_term;
    dest.job = job;
    dst->dest = &dest.pub;
    jpeg_copy_critical_parameters(src, dst);
    dst->write_JFIF_header = FALSE; /* the source's own APP0 and APP14, if any, are copied below */
    dst->write_Adobe_marker = FALSE;
    dst->restart_interval = interval;
    /* The source's Huffman tables keep the size within a few tenths of a percent (the markers and
     * the DC values coded whole at each restart); optimized ones may lack DC codes: optimize anew. */
    for (i = 0; i < src->num_components; i++)
        source_tables &= dc_table_complete(src->dc_huff_tbl_ptrs[src->comp_info[i].dc_tbl_no]);
    if (source_tables) {
        for (i = 0; i < NUM_HUFF_TBLS; i++) {
            copy_huff_table(dst, &dst->dc_huff_tbl_ptrs[i], src->dc_huff_tbl_ptrs[i]);
            copy_huff_table(dst, &dst->ac_huff_tbl_ptrs[i], src->ac_huff_tbl_ptrs[i]);
        }
        for (i = 0; i < src->num_components; i++) {
            dst->comp_info[i].dc_tbl_no = src->comp_info[i].dc_tbl_no;
            dst->comp_info[i].ac_tbl_no = src->comp_info[i].ac_tbl_no;
        }
    } else {
        dst->optimize_coding = TRUE;
    }
    jpeg_write_coefficients(dst, coefs);
    for (marker = src->marker_list; marker; marker = marker->next)
        if (!(marker->marker == TABLE_MARKER && is_table(marker->data, marker->data_length))) /* a stale table */
            jpeg_write_marker(dst, marker->marker, marker->data, marker->data_length);
    jpeg_finish_compress(dst);
    dst->dest = NULL; /* `dest` lives on this stack frame only */
}

/* Where the SOS marker is, and where its segment ends (the scan's data starts), in a file
 * libjpeg wrote: no fill bytes, one scan. */
static int find_scan(const unsigned char *d, size_t n, size_t *sos, size_t *start) {
    size_t pos = 2;
    while (pos + 4 <= n && d[pos] == 0xFF) {
        size_t length = ((size_t)d[pos + 2] << 8) | d[pos + 3];
        if (d[pos + 1] == 0xDA) {
            *sos = pos;
            *start = pos + 2 + length;
            return *start <= n;
        }
        pos += 2 + length;
    }
    return 0;
}

static void put32(unsigned char *p, size_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Inserts the restart table before SOS of job->out. Returns 0; 1 when an offset inside a row does not
 * fit 16 bits (try whole rows); -1 with job->message on a file that is not as libjpeg writes it. */
static int insert_table(Job *job, const Grid *grid) {
    const unsigned char *d = job->out;
    size_t sos, start, pos, n = 0, total, groups = grid->per_row / grid->interval, table_size, payload, row_start = 0;
    size_t *starts;
    unsigned char *final, *p;

    if (!find_scan(d, job->out_size, &sos, &start)) {
        snprintf(job->message, sizeof job->message, "transcoded file has no scan");
        return -1;
    }
    total = (size_t)grid->rows * groups;
    starts = malloc((total + 1) * sizeof *starts);
    if (!starts) {
        snprintf(job->message, sizeof job->message, "out of memory");
        return -1;
    }
    starts[n++] = 0;
    for (pos = start; pos + 1 < job->out_size; pos++) { /* in scan data a 0xFF byte is followed by 0 or a marker */
        if (d[pos] != 0xFF || d[pos + 1] == 0) continue;
        if (d[pos + 1] == 0xD9 || n > total) break;
        starts[n++] = pos + 2 - start; /* RSTn: the next interval starts after it */
        pos++;
    }
    if (n != total || pos + 1 >= job->out_size || d[pos + 1] != 0xD9) {
        free(starts);
        snprintf(job->message, sizeof job->message, "transcoded file has %zu restart intervals, expected %zu", n, total);
        return -1;
    }
    starts[n] = pos - start; /* the EOI marker */
    for (pos = 0; pos < total; pos++) {
        if (pos % groups == 0) row_start = starts[pos];
        else if (starts[pos] - row_start > 0xFFFF) {
            free(starts);
            return 1;
        }
    }
    payload = TABLE_HEADER + 4 * ((size_t)grid->rows + 1) + 2 * (size_t)grid->rows * (groups - 1);
    table_size = 4 + payload;
    if (payload + 2 > 0xFFFF || starts[total] > 0xFFFFFFFFu) {
        free(starts);
        return 1;
    }
    final = malloc(job->out_size + table_size);
    if (!final) {
        free(starts);
        snprintf(job->message, sizeof job->message, "out of memory");
        return -1;
    }
    memcpy(final, d, sos);
    p = final + sos;
    *p++ = 0xFF;
    *p++ = (unsigned char)TABLE_MARKER;
    *p++ = (unsigned char)((payload + 2) >> 8);
    *p++ = (unsigned char)(payload + 2);
    memcpy(p, TABLE_ID, sizeof TABLE_ID);
    p += sizeof TABLE_ID;
    *p++ = TABLE_VERSION;
    for (pos = 0; pos <= grid->rows; pos++, p += 4) put32(p, starts[pos * groups]);
    for (pos = 0; pos < total; pos++) {
        if (pos % groups == 0) {
            row_start = starts[pos];
        } else {
            size_t rel = starts[pos] - row_start;
            *p++ = (unsigned char)rel;
            *p++ = (unsigned char)(rel >> 8);
        }
    }
    memcpy(p, d + sos, job->out_size - sos);
    free(starts);
    free(job->out);
    job->out = final;
    job->out_size += table_size;
    return 0;
}

/* Reads job->out back and compares it with the source: frame, colour space, quantization tables
 * and every coefficient block. Returns 0, or -1 with job->message. */
static int check(j_decompress_ptr src, jvirt_barray_ptr *coefs, Job *job) {
    struct jpeg_decompress_struct out;
    ErrorManager err;
    jvirt_barray_ptr *out_coefs;
    int c, same;
    JDIMENSION row;

    out.err = strict_errors(&err);
    if (setjmp(err.jump)) {
        char reason[JMSG_LENGTH_MAX];
        err.pub.format_message((j_common_ptr)&out, reason);
        snprintf(job->message, sizeof job->message, "transcoded file does not read back: %s", reason);
        jpeg_destroy_decompress(&out);
        return -1;
    }
    jpeg_create_decompress(&out);
    jpeg_mem_src(&out, job->out, (unsigned long)job->out_size);
    jpeg_read_header(&out, TRUE);
    same = out.image_width == src->image_width && out.image_height == src->image_height &&
           out.num_components == src->num_components && out.jpeg_color_space == src->jpeg_color_space &&
           out.saw_JFIF_marker == src->saw_JFIF_marker && out.saw_Adobe_marker == src->saw_Adobe_marker &&
           out.Adobe_transform == src->Adobe_transform && !out.progressive_mode && !out.arith_code;
    for (c = 0; same && c < src->num_components; c++) {
        jpeg_component_info *a = src->comp_info + c, *b = out.comp_info + c;
        same = a->component_id == b->component_id && a->h_samp_factor == b->h_samp_factor &&
               a->v_samp_factor == b->v_samp_factor && a->quant_table && out.quant_tbl_ptrs[b->quant_tbl_no] &&
               memcmp(a->quant_table->quantval, out.quant_tbl_ptrs[b->quant_tbl_no]->quantval,
                      sizeof a->quant_table->quantval) == 0;
    }
    if (same) {
        out_coefs = jpeg_read_coefficients(&out);
        for (c = 0; same && c < src->num_components; c++) {
            jpeg_component_info *a = src->comp_info + c;
            for (row = 0; same && row < a->height_in_blocks; row++) {
                JBLOCKARRAY x = (*src->mem->access_virt_barray)((j_common_ptr)src, coefs[c], row, 1, FALSE);
                JBLOCKARRAY y = (*out.mem->access_virt_barray)((j_common_ptr)&out, out_coefs[c], row, 1, FALSE);
                same = memcmp(x[0], y[0], a->width_in_blocks * sizeof(JBLOCK)) == 0;
            }
        }
    }
    jpeg_destroy_decompress(&out);
    if (!same) {
        snprintf(job->message, sizeof job->message, "transcoded file differs from the source");
        return -1;
    }
    return 0;
}

/* The smallest divisor of the row's MCU count that is at least `at_least` (the whole row if none). */
static unsigned divisor_from(unsigned per_row, unsigned at_least) {
    unsigned k;
    for (k = at_least ? at_least : 1; k < per_row && per_row % k; k++) {}
    return k < per_row ? k : per_row;
}

/* The MCU grid, and the first restart interval to try: the fewest MCUs that divide a row and span
 * MIN_INTERVAL_PIXELS. */
static Grid grid_of(j_decompress_ptr src) {
    Grid grid;
    unsigned mcu_w = 8, mcu_h = 8;
    if (src->num_components > 1) { /* interleaved: an MCU holds every component's blocks */
        mcu_w = 8 * (unsigned)src->max_h_samp_factor;
        mcu_h = 8 * (unsigned)src->max_v_samp_factor;
    }
    grid.per_row = (src->image_width + mcu_w - 1) / mcu_w;
    grid.rows = (src->image_height + mcu_h - 1) / mcu_h;
    grid.interval = divisor_from(grid.per_row, (MIN_INTERVAL_PIXELS + mcu_w - 1) / mcu_w);
    return grid;
}

/* Runs without the GIL. Returns 0 with job->out set, or -1 with job->message. */
static int transcode_job(Job *job) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    ErrorManager err;
    jvirt_barray_ptr *coefs;
    Grid grid;
    int m, rc = -1;
    volatile int made_dst = 0;

    src.err = strict_errors(&err);
    if (setjmp(err.jump)) {
        err.pub.format_message(made_dst ? (j_common_ptr)&dst : (j_common_ptr)&src, job->message);
        if (made_dst) jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        return -1;
    }
    jpeg_create_decompress(&src);
    jpeg_mem_src(&src, job->data, (unsigned long)job->size);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (m = 0; m < 16; m++) jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    if (src.progressive_mode || src.arith_code || src.data_precision != 8 ||
        (src.num_components != 1 && src.num_components != 3) ||
        src.jpeg_color_space == JCS_CMYK || src.jpeg_color_space == JCS_YCCK) {
        snprintf(job->message, sizeof job->message, "%s JPEG",
                 src.progressive_mode ? "progressive" : src.arith_code ? "arithmetic-coded" :
                 src.data_precision != 8 ? "not an 8-bit" : "not a grayscale, YCbCr or RGB");
        job->not_transcodable = 1;
        jpeg_destroy_decompress(&src);
        return -1;
    }
    coefs = jpeg_read_coefficients(&src);
    grid = grid_of(&src);
    for (;;) { /* coarser intervals until the table's offsets fit and the growth is allowed */
        int table;
        jpeg_create_compress(&dst);
        dst.err = &err.pub;
        made_dst = 1;
        encode(&src, coefs, grid.interval, &dst, job);
        jpeg_destroy_compress(&dst);
        made_dst = 0;
        table = insert_table(job, &grid);
        if (table < 0) break;
        if (table == 0 && job->out_size <= job->size * (1.0 + job->max_growth)) {
            rc = check(&src, coefs, job);
            break;
        }
        if (grid.interval == grid.per_row) { /* whole rows are as coarse as restarts get */
            snprintf(job->message, sizeof job->message, "restart markers would add more than %g%%",
                     100.0 * job->max_growth);
            job->not_transcodable = 1;
            break;
        }
        free(job->out);
        job->out = NULL;
        grid.interval = divisor_from(grid.per_row, 2 * grid.interval);
    }
    jpeg_destroy_decompress(&src);
    return rc;
}

static PyObject *transcode(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "max_growth", NULL};
    Py_buffer data;
    Job job;
    int rc;
    PyObject *result;

    (void)self;
    memset(&job, 0, sizeof job);
    job.max_growth = 0.02;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|d:transcode", keywords, &data, &job.max_growth))
        return NULL;
    job.data = data.buf;
    job.size = (size_t)data.len;
    Py_BEGIN_ALLOW_THREADS
    rc = transcode_job(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (rc != 0) {
        free(job.out);
        return PyErr_Format(job.not_transcodable ? NotTranscodable : PyExc_ValueError, "%s", job.message);
    }
    result = PyBytes_FromStringAndSize((const char *)job.out, (Py_ssize_t)job.out_size);
    free(job.out);
    return result;
}

static PyMethodDef methods[] = {
    {"transcode", (PyCFunction)(void (*)(void))transcode, METH_VARARGS | METH_KEYWORDS,
     "transcode(data, max_growth=0.02) -> bytes\n\n"
     "The JPEG `data` with restart markers at every MCU row (and at intervals of at least 64 pixels\n"
     "inside rows where they divide it) and a StokerRST APP9 table of where each interval starts;\n"
     "same coefficients, tables and APPn/COM segments, checked by reading it back. Raises\n"
     "NotTranscodable for progressive, arithmetic-coded, 12-bit and CMYK files and when the output\n"
     "would grow by more than max_growth, ValueError when libjpeg cannot read `data` cleanly."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg_restart",
    "Lossless JPEG transcode adding restart markers and a table of their offsets (libjpeg-turbo).", -1, methods,
};

PyMODINIT_FUNC PyInit__jpeg_restart(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    NotTranscodable = PyErr_NewExceptionWithDoc("stoker.pack._jpeg_restart.NotTranscodable",
                                                "The JPEG is of a kind that is stored as it is.", PyExc_ValueError,
                                                NULL);
    if (!NotTranscodable || PyModule_AddObject(m, "NotTranscodable", NotTranscodable) < 0) {
        Py_XDECREF(NotTranscodable);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(NotTranscodable);
    return m;
}
