/* expr.h: small integer expressions over config.json, used by plan files.
 *
 * Grammar (C-like precedence): literals (integers, 'strings' or "strings"), identifiers that
 * name config keys (dotted for nested keys: linear_attn_config.num_heads) or bound variables
 * (the layer index i of a matched name, T, r), indexing (layer_types[i]), + - * / %, comparisons,
 * && || !, the ternary ?:, and the functions has(x), first(a, b, ...), cdiv(a, b), min, max,
 * len(list), in(x, list), tensor('name') (whether the checkpoint holds that tensor: a view entry's
 * condition, per match, through the context's tensor callback; an error elsewhere). Division must
 * be exact (a plan that divides 4096 by 3 is a bug).
 * A key missing from the config (or null) is a "missing" value: has() and first() test it; any
 * other use is an error that names the key (== and != excepted: missing equals only missing). An
 * index outside a list (past its end, or negative) is missing inside has() and first() and an
 * error anywhere else: an MTP layer past layer_types is first(layer_types[i], 'full_attention').
 * `&&`, `||` and `?:` short-circuit: the untaken side is parsed (a syntax error there is still an
 * error) but not evaluated, so `has(foo) && foo > 3` is false, not an error, when foo is missing.
 * first() evaluates its arguments left to right and only up to the first present one (the rest
 * are parsed only), so first(head_dim, hidden_size / num_attention_heads) with head_dim given
 * never divides; the index of a missing list is parsed only (has(foo[i]) reads no more than foo).
 * Arithmetic is checked (overflow, division by zero, inexact division), literals must fit in
 * int64, and nesting is limited to TP_EXPR_MAX_DEPTH. Errors have the code TP_ERULE.
 *
 * Config keys are looked up first under each of the context's prefixes (e.g. "text_config" for
 * vision-language wrappers), then at the top level, then in the context's defaults (a view's
 * "defaults": the config class's values where config.json says nothing). This is the one lookup
 * order of plans, views and per-rank counts.
 */
#ifndef TP_EXPR_H
#define TP_EXPR_H

#include <stdint.h>

#include "tp_err.h"

struct cJSON;

#define TP_EXPR_MAX_VARS 12 /* a view's T, P, EP, EP_RR, DP and an entry's TP_VIEW_VARS (4), with room */
#define TP_EXPR_MAX_PREFIX 4
#define TP_EXPR_MAX_DEPTH 100   /* nesting of (), [], arguments, ?: and unary operators together */
#define TP_EXPR_MAX_DEPTH_S "100"

typedef struct tp_expr_ctx {
	const struct cJSON *config;          /* config.json (may be NULL: every key is missing) */
	const struct cJSON *defaults;        /* looked up after config (NULL: none) */
	const char *prefix[TP_EXPR_MAX_PREFIX]; /* sub-objects to try first */
	int nprefix;
	char var[TP_EXPR_MAX_VARS][16];      /* bound variable names (truncated to 15) and values */
	int64_t val[TP_EXPR_MAX_VARS];
	int nvar;
	struct {                             /* the keys the last evaluation read (up to 8) */
		char key[96];                /* as primary() reads a name: up to 95 characters */
		const struct cJSON *node;
	} usedk[8];
	int nused;
	char used[256];                      /* tp_expr_used's text */
	/* tensor('name'): 1 where the checkpoint holds the tensor (its template filled in by the
	 * callback), 0 where not, -1 where the name cannot be filled; NULL: tensor() is an error */
	int (*tensor)(void *arg, const char *name);
	void *tensor_arg;
	char missing[96];                    /* the first key the last evaluation read and found in
	                                      * neither config nor defaults, outside has() and first()
	                                      * ("" when none): a caller that treats an unknown key as an
	                                      * error (view conditions) reads it */
} tp_expr_ctx;

/* "key=value, ..." of the config keys the last evaluation read ("" when none), formatted now
 * (in c->used) from what the evaluation noted: only messages need it. */
const char *tp_expr_used(tp_expr_ctx *c);

/* Binds (or rebinds) a variable. */
void tp_expr_bind(tp_expr_ctx *c, const char *name, int64_t v);

/* Evaluates src to an integer (booleans are 0/1). Returns 0, 1 when the result is missing
 * (a missing key reached the top level: the caller decides whether that is an error), or -1 on
 * error with a message naming the expression. */
int tp_expr_int(tp_expr_ctx *c, const char *src, int64_t *out, tp_err *e);

/* Evaluates src as a condition: missing counts as false. Returns 0/1, or -1 on error. */
int tp_expr_cond(tp_expr_ctx *c, const char *src, tp_err *e);

/* Parses src without evaluating it (no config is read): 0, or -1 with the syntax error. */
int tp_expr_check(const char *src, tp_err *e);

/* Looks up a config key (dotted path: prefixes first, then the top level, then defaults). Returns
 * the cJSON node or NULL. */
const struct cJSON *tp_config_get(const tp_expr_ctx *c, const char *key);

#endif
