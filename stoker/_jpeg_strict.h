/* libjpeg error handling shared by stoker's C extensions (stoker/decode/_jpeg_region.c,
 * stoker/pack/_jpeg_restart.c): errors and warnings jump back to the caller's setjmp.
 * Include after jpeglib.h. */
#ifndef STOKER_JPEG_STRICT_H
#define STOKER_JPEG_STRICT_H

#include <setjmp.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} ErrorManager;

/* libjpeg's default error_exit calls exit(); jump back to the caller instead. The message is
 * formatted there from cinfo->err, which keeps msg_code and msg_parm. */
static void on_error(j_common_ptr cinfo) {
    longjmp(((ErrorManager *)cinfo->err)->jump, 1);
}

/* level -1 is a warning: corrupt data, or premature end of data, which libjpeg would pad with
 * gray. Be strict and treat it as an error; levels >= 0 are trace messages, ignored. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) longjmp(((ErrorManager *)cinfo->err)->jump, 1);
}

/* The error manager to give a libjpeg object (cinfo.err = strict_errors(&err)); the caller then
 * calls setjmp(err.jump) before any libjpeg call that may fail. */
static struct jpeg_error_mgr *strict_errors(ErrorManager *err) {
    struct jpeg_error_mgr *pub = jpeg_std_error(&err->pub);
    pub->error_exit = on_error;
    pub->emit_message = on_message;
    return pub;
}

#endif
