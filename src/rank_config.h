/* rank_config.h: a rank's config.json, written from the source's text.
 *
 * A TP=1 loader builds its modules from config.json, so a rank folder's config.json must state
 * the rank's own counts (heads, intermediate sizes, vocabulary rows, ...). This module rewrites
 * the source text in place: only the values of the listed keys change, every other byte (key
 * order, spacing, how other numbers were written, keys this module does not know) is kept.
 * It is pure text in, text out: which keys and which values is the model's business (model.c).
 */
#ifndef TP_RANK_CONFIG_H
#define TP_RANK_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "tp_err.h"

/* One key to set. path is dotted from the top object ("text_config.num_attention_heads"); a
 * key that itself holds a dot or an escape cannot be named. */
typedef struct tp_cfg_set {
	const char *path;
	int64_t value;
	int add;        /* where the key is missing, add it at the end of its object (which must exist) */
	int null;       /* write null instead of value */
	const char *str; /* or NULL; else write this JSON string instead of value (plain characters: no
	                  * quote, backslash or control character; at most 128 bytes) */
} tp_cfg_set;

/* Writes src (len bytes of JSON, an object) with every key of set[] holding its new value.
 * Paths are distinct; every occurrence of a path is rewritten; each must hold a JSON number (or null) in src, or be missing
 * with add set. On success returns 0 with *out (malloc'd, NUL-terminated, free it) of *outlen
 * bytes; on failure -1 with a message naming fname, the key and the reason. */
int tp_rank_config(const char *src, size_t len, const tp_cfg_set *set, size_t nset, const char *fname,
		   char **out, size_t *outlen, tp_err *e);

#endif
