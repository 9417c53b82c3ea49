/* guard.h: copying from a mapping of a file that may shrink, without dying of SIGBUS.
 *
 * A userspace memcpy from a read-only mapping of a file that was truncated after it was mapped
 * raises SIGBUS. The filesystem copies fragmented gathers that way, so it installs this guard
 * once: a SIGBUS that hits a thread inside tp_guarded_gather unwinds to it (siglongjmp) and the
 * one request fails; a SIGBUS anywhere else keeps its default action.
 */
#ifndef TP_GUARD_H
#define TP_GUARD_H

#include "gather.h"

/* Installs the SIGBUS handler (idempotent). */
void tp_guard_install(void);

/* A gather by backend g under the guard. Returns 0, or -1 with e set (TP_ECHANGED when a
 * SIGBUS hit). */
int tp_guarded_gather(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
		      uint8_t *dst, tp_err *e);

#endif
