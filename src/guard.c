/* guard.c: the SIGBUS guard (see guard.h). */
#include "guard.h"

#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* volatile: the stores around a memcpy the compiler can see through must stay */
static __thread sigjmp_buf *volatile bus_jmp;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)si;
	(void)uc;
	if (bus_jmp)
		siglongjmp(*bus_jmp, 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

void tp_guard_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
}

int tp_guarded_copy(void *dst, const void *src, size_t len)
{
	sigjmp_buf jb;
	/* no signal mask to save: the handler runs with SA_NODEFER, so nothing is left blocked */
	if (sigsetjmp(jb, 0)) {
		bus_jmp = NULL;
		return -1;
	}
	bus_jmp = &jb;
	memcpy(dst, src, len);
	bus_jmp = NULL;
	return 0;
}

int tp_guarded_gather(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
		      uint8_t *dst, tp_err *e)
{
	tp_src guarded = *src;
	guarded.copy = tp_guarded_copy;
	return g->ops->gather(g->self, runs, n, &guarded, hdr, dst, e);
}

int tp_guarded_gather_n(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, uint32_t nsrc,
			const uint8_t *hdr, uint8_t *dst, tp_err *e)
{
	for (size_t i = 0; i < n; i++)
		if (tp_run_reads(&runs[i]) && runs[i].src >= nsrc)
			return tp_fail(e, TP_EINVAL, "run %zu names source %u of a table of %u", i, runs[i].src, nsrc);
	if (!nsrc) /* no source runs */
		return g->ops->gather(g->self, runs, n, src, hdr, dst, e);
	tp_src stack[TP_GUARD_SRCS], *t = nsrc <= TP_GUARD_SRCS ? stack : malloc(nsrc * sizeof *t);
	if (!t)
		return tp_fail(e, TP_ENOMEM, "out of memory copying a table of %u sources", nsrc);
	for (uint32_t k = 0; k < nsrc; k++) {
		t[k] = src[k];
		t[k].copy = tp_guarded_copy;
	}
	int rc = g->ops->gather(g->self, runs, n, t, hdr, dst, e);
	if (t != stack)
		free(t);
	return rc;
}
