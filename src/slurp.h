/* slurp: reading a small file whole (config.json, index files, plan files). The one reader the
 * core uses for them: the 1 GiB limit for JSON files, and a file that reads shorter than its
 * size (it changed while being read) refused rather than half read; and the one way a file named
 * on the command line is opened (tp_open_regular): a FIFO, a device or a folder given as
 * --view FILE or --plan FILE is refused at once, never waited on in open(). */
#ifndef TPFS_SLURP_H
#define TPFS_SLURP_H

#include <stddef.h>

#include "tp_err.h"

struct stat;

/* Opens the file at path for reading without blocking in open(), as opening a FIFO with no writer
 * would: O_NONBLOCK, then fstat, anything but a regular file refused, then O_NONBLOCK cleared.
 * Returns the descriptor (close-on-exec), its status in *st, or -1 with e set: cannot open or
 * stat (TP_EIO, errno kept), not a regular file (TP_EINVAL: "NAME: not a regular file (a FIFO)",
 * with hint appended when not NULL). Messages name the file as name. */
int tp_open_regular(const char *path, const char *name, const char *hint, struct stat *st, tp_err *e);

/* Reads the regular file at path into a NUL-terminated buffer (the caller frees it); *len is
 * its length. Messages name the file as name. NULL with e set: cannot open (TP_EIO), not a
 * regular file (TP_EINVAL, with hint appended when not NULL), over 1 GiB (TP_ELIMIT), out of
 * memory, or read short (TP_EIO). Opened with tp_open_regular. */
char *tp_slurp(const char *path, const char *name, const char *hint, size_t *len, tp_err *e);

#endif
