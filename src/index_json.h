/* index_json.h: the per-rank rewrite of a *.safetensors.index.json. Rank r's index keeps the
 * metadata keys (total_size replaced by the rank's tensor bytes), lists in weight_map only the
 * tensors the rank has, and keeps every other member as it was, each value compact.
 *
 * It knows nothing of the checkpoint's tree: the caller says, through a callback, what each file
 * named by weight_map is (nothing, a file served as it is, or a safetensors file with its
 * layouts). */
#ifndef TP_INDEX_JSON_H
#define TP_INDEX_JSON_H

#include <stdint.h>

#include "layout.h"
#include "st_format.h"
#include "tp_err.h"

struct cJSON;

/* What a file named by an index's weight_map is. */
typedef enum tp_index_kind {
	TP_IX_NONE,    /* no file of the checkpoint (or a folder) */
	TP_IX_OTHER,   /* a file served as it is: its entries are kept on every rank */
	TP_IX_TENSORS, /* a safetensors file served per rank */
} tp_index_kind;

typedef struct tp_index_file {
	tp_index_kind kind;
	const st_header *h;    /* TP_IX_TENSORS: its header */
	const tp_layout *lay;  /* TP_IX_TENSORS: its T layouts */
} tp_index_file;

/* Where weight_map's file path rel (relative to the index's folder) leads. */
typedef tp_index_file (*tp_index_find_fn)(void *ctx, const char *rel);

typedef struct tp_index_in {
	const char *path;      /* the index's path, for messages */
	uint32_t T;
	tp_index_find_fn find;
	void *find_ctx;
	tp_log_fn log;         /* warnings (level 0), or NULL */
	void *log_ctx;
} tp_index_in;

/* Writes the T rewrites of the index parsed as j into *gen / *gen_len (arrays of T, allocated
 * here; on failure what was allocated is left there for the caller to free), once the layouts
 * of the files it lists are built. Entries naming no file or no tensor are reported as warnings
 * through in->log. Returns 0, or -1 with e set. */
int tp_index_rewrite(const tp_index_in *in, const struct cJSON *j, char ***gen, uint64_t **gen_len, tp_err *e);

#endif
