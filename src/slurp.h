/* slurp: reading a small file whole (config.json, index files, plan files). The one reader the
 * core uses for them: the 1 GiB limit for JSON files, and a file that reads shorter than its
 * size (it changed while being read) refused rather than half read. */
#ifndef TPFS_SLURP_H
#define TPFS_SLURP_H

#include <stddef.h>

#include "tp_err.h"

/* Reads the regular file at path into a NUL-terminated buffer (the caller frees it); *len is
 * its length. Messages name the file as name. NULL with e set: cannot open (TP_EIO), not a
 * regular file (TP_EINVAL, with hint appended when not NULL), over 1 GiB (TP_ELIMIT), out of
 * memory, or read short (TP_EIO). */
char *tp_slurp(const char *path, const char *name, const char *hint, size_t *len, tp_err *e);

#endif
