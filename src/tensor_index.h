/* tensor_index.h: the checkpoint-wide index of tensors by (folder, name), through which
 * resolution finds the other tensors of a tensor's module (its reference weight, its scales).
 * Companions are looked up in the tensor's own folder only: two checkpoints in two folders of
 * one SRC do not see each other's tensors. */
#ifndef TP_TENSOR_INDEX_H
#define TP_TENSOR_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "st_format.h"
#include "tp_err.h"

/* One safetensors file for the index: the folder it lies in (a node number of the caller's
 * tree; only equality matters) and its header. */
typedef struct tp_tindex_file {
	uint32_t dir;
	const st_header *h;
} tp_tindex_file;

typedef struct tp_tindex_ent {
	uint32_t dir;        /* the folder node of the file that holds t */
	const st_tensor *t;
} tp_tindex_ent;

typedef struct tp_tindex {
	tp_tindex_ent *ix;   /* sorted by (dir, name) */
	size_t n;
	uint32_t dir;        /* the folder tp_tindex_lookup searches */
} tp_tindex;

/* Indexes every tensor of the nf files f (their headers must outlive the index). A name found
 * in two files of one folder is refused when strict, else reported as a warning (level 0)
 * through log (which may be NULL). Returns 0, or -1 with e set (x is then empty). */
int tp_tindex_build(tp_tindex *x, const tp_tindex_file *f, size_t nf, int strict, tp_log_fn log, void *lctx,
		    tp_err *e);
void tp_tindex_free(tp_tindex *x);

/* A tp_lookup_fn: the tensor called name in folder ((tp_tindex *)x)->dir, or NULL. O(log n). */
const st_tensor *tp_tindex_lookup(void *x, const char *name);

#endif
