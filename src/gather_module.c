/* gather_module.c: loading the CUDA gather module (see gather_module.h). */
#include "gather_module.h"

#include "run.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TPFS_MODULE_DIR
#define TPFS_MODULE_DIR ""
#endif
#define MODULE "tpfs-cuda.so"

/* dlopen()s the module from the first place that has it; NULL with the reason otherwise. */
static void *open_module(char *why, size_t n)
{
	char exe[PATH_MAX];
	const char *env = getenv("TPFS_CUDA_MODULE");
	const char *tried[3] = {NULL, NULL, NULL};
	char bufs[3][PATH_MAX + 32];
	int k = 0;
	if (env && *env)
		tried[k++] = env;
	ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (l > 0) {
		exe[l] = 0;
		char *slash = strrchr(exe, '/');
		if (slash) {
			*slash = 0;
			snprintf(bufs[k], sizeof bufs[k], "%s/%s", exe, MODULE);
			tried[k] = bufs[k];
			k++;
		}
	}
	if (TPFS_MODULE_DIR[0]) {
		snprintf(bufs[k], sizeof bufs[k], "%s/%s", TPFS_MODULE_DIR, MODULE);
		tried[k] = bufs[k];
		k++;
	}
	for (int i = 0; i < k; i++) {
		if (access(tried[i], R_OK) != 0)
			continue;
		void *h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
		const unsigned *abi = h ? (const unsigned *)dlsym(h, "tp_cuda_abi") : NULL;
		if (h && (!abi || *abi != TP_RUN_ABI)) { /* built from another tp_run: it would misread every run */
			snprintf(why, n, "%s was built for run layout %#x, this tpfs reads %#x: rebuild it with this tpfs",
				 tried[i], abi ? *abi : 0u, TP_RUN_ABI);
			dlclose(h);
			return NULL;
		}
		if (h)
			return h;
		snprintf(why, n, "cannot load %s: %s", tried[i], dlerror());
		return NULL;
	}
	snprintf(why, n, "this build has no CUDA gather module (%s not found; it is built where nvcc exists)", MODULE);
	return NULL;
}

int tp_cuda_available(char *why, size_t n)
{
	int p[2];
	if (pipe(p) < 0) {
		snprintf(why, n, "pipe: %s", strerror(errno));
		return -1;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		char msg[512];
		int rc = -1;
		void *h = open_module(msg, sizeof msg);
		if (h) {
			int (*probe)(char *, size_t) = (int (*)(char *, size_t))dlsym(h, "tp_cuda_probe");
			rc = probe ? probe(msg, sizeof msg) : (snprintf(msg, sizeof msg, "the module has no tp_cuda_probe"), -1);
		}
		if (write(p[1], msg, strlen(msg)) < 0)
			_exit(2);
		_exit(rc == 0 ? 0 : 1);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		snprintf(why, n, "fork: %s", strerror(errno));
		return -1;
	}
	ssize_t got = read(p[0], why, n - 1);
	why[got > 0 ? got : 0] = 0;
	close(p[0]);
	int status = 0;
	waitpid(pid, &status, 0);
	if (!why[0])
		snprintf(why, n, "the CUDA probe died (status %d)", status);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int tp_cuda_load(tp_gather *g, char *why, size_t n)
{
	void *h = open_module(why, n);
	if (!h)
		return -1;
	int (*open_fn)(tp_gather *, char *, size_t) = (int (*)(tp_gather *, char *, size_t))dlsym(h, "tp_cuda_open");
	if (!open_fn) {
		snprintf(why, n, "the module has no tp_cuda_open");
		return -1;
	}
	return open_fn(g, why, n);
}
