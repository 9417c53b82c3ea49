/* plan.h: plans as data. A plan file (JSON) holds rules; each rule matches tensor names and
 * says how the module they belong to is split. This file owns the data model (tp_plan, tp_rule),
 * the split kinds, parsing and extending plan files, and name patterns. It knows nothing of
 * checkpoints: choosing a plan and resolving tensors against it is planner.h's; the built-in
 * plan texts are plan_builtin.h's.
 *
 * Plan file format (docs/PLANS.md has the full reference):
 *   { "tpfs_plan": 1, "name": "llama", "description": "...",
 *     "detect": {"model_type": [...], "architectures": [...]},
 *     "config_prefix": ["text_config"],
 *     "extends": "llama",                    (user plans: fall back to that built-in's rules)
 *     "per_rank": [{"key": "num_attention_heads", "groups": false, "uneven": false}, ...,
 *                  {"key": "vocab_size", "vocab": true}, {"key": "head_dim", "value": "expr"}],
 *     "rules": [ { "name": "...", "match": "model.layers.{i}.self_attn.q_proj" | [...],
 *                  "when": "expr", "split": KIND (TP_SPLIT_KINDS below),
 *                  "axis": n, "heads": "expr", "unit": "expr", "size": "expr",
 *                  "segments": ["expr" | {"size": "expr", "heads"|"unit": "expr"}, ...],
 *                  "uneven": bool, "groups": bool,
 *                  "vocab": bool, "bias": "split|replicate", "div": n,
 *                  "reason": "why a refuse rule refuses" }, ... ],
 *     "experts": [ { "name": "routed", "match": "**.layers.{i}.mlp.experts.{e}.**" | [...],
 *                    "count": "expr", "axis": n }, ... ] }
 *
 * "experts" declares which tensors are routed experts, for expert parallelism (--ep): a pattern
 * with the expert-index wildcard {e} names the tensors of expert e; a pattern without it names
 * fused experts tensors that hold every expert along "axis" (default 0: [E, ...]). "count" is
 * the number of routed experts E. Under --ep these declarations decide before any rule: rank r
 * of N holds experts [r*E/N, (r+1)*E/N) whole and no other. Without --ep they only mark the
 * tensors as experts (refusals then suggest --ep).
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

/* How a split kind finds the axis of its module's reference tensor. */
typedef enum tp_ref_axis {
	TK_AX_NONE,  /* nothing is split (replicate) */
	TK_AX_FIRST, /* dim 0 */
	TK_AX_LAST,  /* the last dim */
	TK_AX_RULE,  /* the rule's "axis" (negative: from the end) */
	TK_AX_HEADS, /* the one dim whose size is the rule's "heads" (A_log [1, 1, H, 1]) */
	TK_AX_REFUSE,/* none: the tensor is refused, with the rule's "reason" */
} tp_ref_axis;

/* Which axis of a companion (another tensor of the module: bias, scales) is cut. */
typedef enum tp_comp_axis {
	TK_CA_NONE,     /* replicate */
	TK_CA_FIRST,    /* dim 0 */
	TK_CA_LAST,     /* the last dim */
	TK_CA_SAME,     /* the reference's dim index */
	TK_CA_FROM_END, /* the reference's dim counted from the end ([E, D, 2I] -> bias [E, 2I]) */
} tp_comp_axis;

/* What happens to a companion with fewer dims than the reference (or to a 1-D one). The
 * rule's "bias" field overrides it for 1-D companions. */
typedef enum tp_comp_lower {
	TK_LO_SPLIT,        /* cut like the others (column biases) */
	TK_LO_VEC_WHOLE,    /* 1-D companions whole (row-parallel biases) */
	TK_LO_VEC_FEWER,    /* 1-D companions whole when the reference has more dims */
	TK_LO_FEWER_WHOLE,  /* any companion with fewer dims than the reference whole */
} tp_comp_lower;

enum { TK_NEED_AXIS = 1, TK_NEED_HEADS = 2, TK_NEED_REASON = 4 }; /* fields a rule of the kind must give */

/* THE list of split kinds, in one place: id, name in plan files, label in `tpfs plan`, how the
 * reference axis is found, which companion axis is cut, lower-rank companions, required fields.
 * Adding a kind is one line here (plus its row in docs/PLANS.md and a test); parsing, the
 * error that lists the kinds, resolution and `tpfs plan` all read this table. */
#define TP_SPLIT_KINDS(X)                                                                          \
	X(REPLICATE,  "replicate",  "replicate", TK_AX_NONE,  TK_CA_NONE,  TK_LO_SPLIT,     0)           \
	X(COLUMN,     "column",     "column",    TK_AX_FIRST, TK_CA_FIRST, TK_LO_SPLIT,     0)           \
	X(ROW,        "row",        "row",       TK_AX_LAST,  TK_CA_LAST,  TK_LO_VEC_WHOLE, 0)           \
	X(AXIS,       "axis",       "axis",      TK_AX_RULE,  TK_CA_SAME,  TK_LO_VEC_FEWER, TK_NEED_AXIS) \
	X(HEADS_AXIS, "heads_axis", "heads",     TK_AX_HEADS, TK_CA_SAME,  TK_LO_VEC_FEWER, TK_NEED_HEADS) \
	X(REFUSE,     "refuse",     "refused",   TK_AX_REFUSE, TK_CA_NONE, TK_LO_SPLIT,     TK_NEED_REASON)

enum tp_split_kind {
#define TP_KIND_ENUM(id, name, label, ref, comp, lower, needs) PL_##id,
	TP_SPLIT_KINDS(TP_KIND_ENUM)
#undef TP_KIND_ENUM
	PL_NKINDS
};

typedef struct tp_split_kind_def {
	const char *name, *label;
	tp_ref_axis ref;
	tp_comp_axis comp;
	tp_comp_lower lower;
	int needs;
} tp_split_kind_def;

/* The definition of kind k (0 <= k < PL_NKINDS). */
const tp_split_kind_def *tp_split_kind(int k);
/* The kind named name, or -1. */
int tp_split_kind_find(const char *name);

#define TP_MAX_PATTERNS 16

typedef struct tp_rule {
	const char *name;
	const char *pat[TP_MAX_PATTERNS];
	int npat;
	const char *when;
	int split;                       /* enum tp_split_kind (always < PL_NKINDS) */
	int axis;                        /* kinds that need it (TK_NEED_AXIS): may be negative (from the end);
	                                  * heads_axis with axis_pref: the axis preferred when several have the size */
	int axis_pref;                   /* heads_axis: "axis" was given (a preference, not a requirement) */
	const char *heads, *unit, *size; /* expressions or NULL */
	const char *seg[TP_MAX_SEG];     /* segment sizes (logical elements), expressions */
	const char *seg_heads[TP_MAX_SEG]; /* per-segment head count, or NULL */
	const char *seg_unit[TP_MAX_SEG];  /* per-segment unit width, or NULL */
	int nseg;
	int uneven, groups, vocab;
	int bias;                        /* -1 default, 0 replicate, 1 split */
	int64_t div;                     /* > 0: explicit logical elements per stored element */
	const char *reason;              /* refuse rules: why (shown in the refusal) */
} tp_rule;

typedef struct tp_per_rank {
	const char *key;
	int uneven, groups;
	int vocab;         /* shared like a vocab rule: padded to --pad-vocab when given */
	const char *value; /* or NULL; else every rank's value: this expression over the source config
	                    * (a count the split would change by default, e.g. head_dim; added if missing) */
} tp_per_rank;

#define TP_MAX_EXPERT_DECLS 8

/* One "experts" declaration (see the format above). */
typedef struct tp_experts {
	const char *name;
	const char *pat[TP_MAX_PATTERNS];
	int npat;
	const char *count; /* expression: E, the number of routed experts */
	int axis;          /* fused tensors: the expert axis (negative: from the end) */
} tp_experts;

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
	tp_experts experts[TP_MAX_EXPERT_DECLS]; /* the plan's own first, then its bases' */
	int nexperts;
	struct cJSON *json;              /* owns every string above */
	struct cJSON *base[4];           /* the plans this one extends (their rules' strings) */
	int nbase;
} tp_plan;

/* Parses a plan file. origin (a path or "built-in NAME") prefixes messages. */
int tp_plan_parse(const char *text, size_t len, const char *origin, tp_plan *p, tp_err *e);
void tp_plan_free(tp_plan *p);

/* Appends base's rules (and experts declarations) after p's own (for "extends"): p's win. Consumes base (p takes its
 * JSON; base is left empty). */
int tp_plan_extend(tp_plan *p, tp_plan *base, tp_err *e);

/* Matches name against one pattern. Returns the number of bytes of name the pattern covers
 * (the module prefix; the rest is "" or ".role"), or -1. Binds {var} captures into cfg (may
 * be NULL). */
int tp_pattern_match(const char *pat, const char *name, tp_expr_ctx *cfg);

#endif
