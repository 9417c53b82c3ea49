/* gather_module.h: finding and loading the optional CUDA gather module (tpfs-cuda.so).
 *
 * The module is looked up in $TPFS_CUDA_MODULE, next to the running binary, then in the install
 * folder. Loading never fails the program: without the module, or without a device, the CPU
 * backend serves everything and the reason is reported. CUDA must not be initialized in a process
 * that forks afterwards, so the CLI probes in a child process and the daemon opens the backend
 * only after it has forked.
 */
#ifndef TP_GATHER_MODULE_H
#define TP_GATHER_MODULE_H

#include <stddef.h>

#include "gather.h"

/* Is a CUDA device usable through the module? Runs the probe in a child process. Returns 0 with
 * the device in why, or -1 with the reason (module missing, no driver, no device). */
int tp_cuda_available(char *why, size_t n);

/* Opens the CUDA backend in this process. Returns 0, or -1 with the reason. */
int tp_cuda_load(tp_gather *g, char *why, size_t n);

#endif
