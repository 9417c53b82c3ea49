/* plan.h: plans as data. A plan file (JSON) holds rules; each rule matches tensor names and
 * says how the module they belong to is split. Resolution turns (plan, config.json, one
 * tensor, the other tensors of the checkpoint) into a tp_spec, with the cross-checks against
 * the header shapes. Built-in plans are plan files compiled into the binary (the .json files of plans/).
 *
 * Plan file format (docs/PLANS.md has the full reference):
 *   { "tpfs_plan": 1, "name": "llama", "description": "...",
 *     "detect": {"model_type": [...], "architectures": [...]},
 *     "config_prefix": ["text_config"],
 *     "extends": "llama",                    (user plans: fall back to that built-in's rules)
 *     "per_rank": [{"key": "num_attention_heads", "groups": false, "uneven": false}, ...,
 *                  {"key": "vocab_size", "vocab": true}, {"key": "head_dim", "value": "expr"}],
 *     "rules": [ { "name": "...", "match": "model.layers.{i}.self_attn.q_proj" | [...],
 *                  "when": "expr", "split": "replicate|column|row|axis|heads_axis",
 *                  "axis": n, "heads": "expr", "unit": "expr", "size": "expr",
 *                  "segments": ["expr" | {"size": "expr", "heads"|"unit": "expr"}, ...],
 *                  "uneven": bool, "groups": bool,
 *                  "vocab": bool, "bias": "split|replicate", "div": n }, ... ] }
 *
 * Name patterns are dotted: `*` inside a component matches any text without a dot, `{i}`
 * matches an integer component and binds i for expressions, `**` matches any number of
 * components. A pattern names a MODULE: it matches a tensor whose name is the pattern, or the
 * pattern plus one more component (the role: weight, bias, weight_scale_inv, ...). The first
 * rule that matches (and whose `when` holds) decides.
 */
#ifndef TP_PLAN_H
#define TP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "expr.h"
#include "spec.h"
#include "st_format.h"
#include "tp_err.h"

struct cJSON;

enum tp_split_kind { PL_REPLICATE, PL_COLUMN, PL_ROW, PL_AXIS, PL_HEADS_AXIS };

#define TP_MAX_PATTERNS 16

typedef struct tp_rule {
	const char *name;
	const char *pat[TP_MAX_PATTERNS];
	int npat;
	const char *when;
	int split;                       /* enum tp_split_kind */
	int axis;                        /* PL_AXIS: may be negative (from the end) */
	const char *heads, *unit, *size; /* expressions or NULL */
	const char *seg[TP_MAX_SEG];     /* segment sizes (logical elements), expressions */
	const char *seg_heads[TP_MAX_SEG]; /* per-segment head count, or NULL */
	const char *seg_unit[TP_MAX_SEG];  /* per-segment unit width, or NULL */
	int nseg;
	int uneven, groups, vocab;
	int bias;                        /* -1 default, 0 replicate, 1 split */
	int64_t div;                     /* > 0: explicit logical elements per stored element */
} tp_rule;

typedef struct tp_per_rank {
	const char *key;
	int uneven, groups;
	int vocab;         /* shared like a vocab rule: padded to --pad-vocab when given */
	const char *value; /* or NULL; else every rank's value: this expression over the source config
	                    * (a count the split would change by default, e.g. head_dim; added if missing) */
} tp_per_rank;

typedef struct tp_plan {
	const char *name;
	const char *description;
	const char *extends;
	const char *prefix[TP_EXPR_MAX_PREFIX];
	int nprefix;
	tp_rule *rules;
	int nrules;
	tp_per_rank *per_rank;
	int nper_rank;
	struct cJSON *json;              /* owns every string above */
	struct cJSON *base[4];           /* the plans this one extends (their rules' strings) */
	int nbase;
} tp_plan;

/* Parses a plan file. origin (a path or "built-in NAME") prefixes messages. */
int tp_plan_parse(const char *text, size_t len, const char *origin, tp_plan *p, tp_err *e);
void tp_plan_free(tp_plan *p);

/* Appends base's rules after p's own (for "extends"): p's rules win. Consumes base (p takes its
 * JSON; base is left empty). */
int tp_plan_extend(tp_plan *p, tp_plan *base, tp_err *e);

/* Loads a built-in plan by name, following "extends" through other built-ins. */
int tp_plan_builtin(const char *name, tp_plan *p, tp_err *e);

/* Built-in plans. */
int tp_builtin_count(void);
const char *tp_builtin_name(int i);
const char *tp_builtin_text(int i, size_t *len);
/* Index of the built-in plan named name, or -1. */
int tp_builtin_find(const char *name);
/* Index of the first built-in plan whose detect section matches config (model_type or an
 * architecture, at the top level or under text_config), or -1. */
int tp_builtin_detect(const struct cJSON *config);

/* Looks up another tensor of the checkpoint by name (for companions), or NULL. */
typedef const st_tensor *(*tp_lookup_fn)(void *ctx, const char *name);

typedef struct tp_resolve_opts {
	uint32_t T;
	uint64_t pad_vocab; /* 0: vocab rules must divide evenly; else pad to this multiple */
} tp_resolve_opts;

/* What resolution decided for one tensor. */
typedef struct tp_resolved {
	tp_spec spec;
	int rule;            /* index into plan->rules, or -1 when no rule matched */
	char why[160];       /* e.g. "column, 32 heads of 128", "replicate (row-parallel bias)" */
	uint64_t logical;    /* logical axis length L (split tensors) */
} tp_resolved;

/* Resolves the spec of tensor t. cfg holds config.json and the plan's prefixes. Checks the
 * rule against the shapes (size, heads, segments, companions' divisors) and reports a mismatch
 * with the tensor, the rule, the expression, and both numbers. ctx prefixes messages (file
 * name). Distribution over T is checked later, by the layout. */
int tp_plan_resolve(const tp_plan *pl, tp_expr_ctx *cfg, const st_tensor *t, tp_lookup_fn lookup,
		    void *lctx, const tp_resolve_opts *o, const char *ctx, tp_resolved *out,
		    tp_err *e);

/* Matches name against one pattern. Returns the number of bytes of name the pattern covers
 * (the module prefix; the rest is "" or ".role"), or -1. Binds {var} captures into cfg (may
 * be NULL). */
int tp_pattern_match(const char *pat, const char *name, tp_expr_ctx *cfg);

#endif
