/* guard.c: the SIGBUS guard (see guard.h). */
#include "guard.h"

#include <setjmp.h>
#include <signal.h>
#include <string.h>

static __thread sigjmp_buf *bus_jmp;

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

int tp_guarded_gather(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
		      uint8_t *dst, tp_err *e)
{
	sigjmp_buf jb;
	if (sigsetjmp(jb, 1)) {
		bus_jmp = NULL;
		return tp_fail(e, TP_ECHANGED, "the source shrank under its mapping (SIGBUS caught)");
	}
	bus_jmp = &jb;
	int rc = g->ops->gather(g->self, runs, n, src, hdr, dst, e);
	bus_jmp = NULL;
	return rc;
}
