/* guard.h: copying from a mapping of a file that may shrink or fail, without dying of SIGBUS.
 *
 * A userspace memcpy from a read-only mapping of a file that was truncated after it was mapped,
 * or whose disk fails, raises SIGBUS. The filesystem installs this guard once; it wraps only the
 * copies of source bytes out of the mapping (tp_guarded_copy, which every backend calls through
 * tp_src_copy), never a backend as a whole: a SIGBUS inside such a copy unwinds (siglongjmp) to
 * that copy, which returns -1, and the backend returns its error normally, releasing whatever it
 * holds (the CUDA module's mutex). A SIGBUS anywhere else keeps its default action.
 */
#ifndef TP_GUARD_H
#define TP_GUARD_H

#include "gather.h"

/* Installs the SIGBUS handler (idempotent). */
void tp_guard_install(void);

/* memcpy under the guard. Returns 0, or -1 when a SIGBUS hit (dst then partly written). */
int tp_guarded_copy(void *dst, const void *src, size_t len);

/* A gather by backend g whose source copies go through tp_guarded_copy, from the one source src
 * (every run names source 0). Returns 0, or -1 with e set (TP_ECHANGED when a SIGBUS hit). */
int tp_guarded_gather(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
		      uint8_t *dst, tp_err *e);

/* The same from a table of nsrc sources (each run's src < nsrc; a run naming another source is
 * refused with TP_EINVAL before anything is copied). Returns 0, or -1 with e set (TP_ENOMEM when
 * a table past TP_GUARD_SRCS entries cannot be copied). */
#define TP_GUARD_SRCS 64 /* sources a guarded gather copies on the stack */
int tp_guarded_gather_n(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, uint32_t nsrc,
			const uint8_t *hdr, uint8_t *dst, tp_err *e);

#endif
