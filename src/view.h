/* view.h: engine views: how one rank's tensors, already cut by the plan, are named and packed
 * for a serving engine's own per-rank files (vLLM's sharded_state: model-rank-{r}-part-{p}).
 *
 * A view is data (views/<engine>/<name>.json, built in like the plans; docs/PLANS.md gives the
 * format): a list of entries, each making served tensors from source tensors whose names match
 * templates (`{i}` binds a run of digits): `cat` (the pieces' local cuts concatenated along the
 * first axis: q, k, v as qkv_proj), `stack` over a variable (every expert's cat as one [E, ...]
 * tensor), `from` (a rename), `const` (a scalar per match of `per`, such as an attention scale
 * 1.0), `drop` (source tensors not served: applied before every other entry, so that the others
 * never see them; a drop template may end in `*`, any rest). Source tensors no entry uses keep
 * their names (`keep_rest`), or take a new prefix (`rename`).
 *
 * tp_view_resolve turns a view and the planned source files into the served tensors of every part
 * (one part per source file: a tensor goes to the part of its first piece's file), each a list
 * of pieces (tp_sdesc, served.h), the same for every rank: served.c cuts them per rank. Pure: no
 * I/O; every refusal names the view, the entry and the tensor.
 */
#ifndef TP_VIEW_H
#define TP_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "served.h"
#include "spec.h"
#include "st_format.h"
#include "tp_err.h"

struct cJSON;

#define TP_VIEW_VARS 4 /* template variables in one entry */
#define TP_VIEW_CONST_MAX 4096 /* elements of one constant ("const" with "shape") */
#define TP_VIEW_RENAMES 16 /* "rename" prefix pairs */

typedef enum tp_ventry_kind { TP_VE_CAT, TP_VE_CONST, TP_VE_DROP } tp_ventry_kind;

typedef struct tp_ventry {
	tp_ventry_kind kind;
	const char *name;      /* served name template (CAT, CONST) */
	const char *cat[8];    /* piece templates, in order (CAT: `cat`, or `from` as one) */
	uint32_t ncat;
	const char *stack;     /* the variable stacked over, or NULL */
	const char *per;       /* CONST: made once per source tensor matching this; DROP: what is dropped
	                        * (a template that may end in '*': any rest of the name) */
	int to_f32;            /* "dtype": "F32": BF16 / F16 pieces served widened to F32 */
	int transpose;         /* "transpose": true: the last two axes swapped (tp_sdesc.transpose) */
	int rank0_only;        /* "other_ranks": "zeros": zeros on ranks other than 0 (tp_sdesc.rank0_only) */
	/* "deinterleave": per piece (cat order), NULL or a plan expression N over config.json: the
	 * piece's local rows in blocks of N, each served as its even rows, then its odd rows (vLLM's
	 * Llama 4 q / k rows: tp_pdesc.deint); N evaluated by the caller (tp_vcfg.dil_rows) */
	const char *dil[8];
	uint32_t rs_ndim;      /* "reshape": [d, ...] (one d may be -1): the served shape, same bytes;
	                        * CONST: the constant's shape (0: a scalar) */
	int64_t rs_shape[ST_MAX_DIMS];
	const char *cond;      /* "if": a plan expression over config.json and T: the entry applies only
	                        * where it is true; with tensor('NAME') or the entry's variables (its
	                        * first piece's, per's or drop's: `n >= num_hidden_layers`), for each
	                        * match (per_match) */
	int per_match;         /* cond reads the source's tensors or the match's variables: evaluated by
	                        * tp_view_resolve, per match, with the variables bound, over
	                        * tp_vcfg.cond_ctx; otherwise by the caller, once (tp_vcfg.off) */
	st_dtype cdtype;       /* CONST: F32 or BF16 */
	uint32_t cbits;        /* CONST: the element's bits in cdtype (BF16: the low 16), finite: view.c
	                        * refuses a value that rounds to infinity */
} tp_ventry;

typedef struct tp_view {
	struct cJSON *json;    /* owns every string above */
	const char *name, *engine, *proven;
	char origin[256];      /* "built-in vllm view 'llama'", or the file's path */
	const char *plans[16]; /* the plans it applies to */
	uint32_t nplans;
	const char *model_types[32];
	uint32_t nmodel_types;
	const char *quant_methods[8]; /* "quant_methods": the quantization_config.quant_method values it
	                              * serves; none: only checkpoints without a quantization_config */
	uint32_t nquant;
	uint64_t pad_vocab;    /* the vocabulary padded to a multiple of this before it is split */
	const struct cJSON *defaults; /* "defaults": config.json keys' values where config.json has none
	                              * (the config class's defaults, e.g. Gemma 3's tie), or NULL */
	/* "refuse": [{"if": EXPR, "reason": TEXT}]: checkpoints the engine would hold in another layout
	 * than the view makes (a plan expression over config.json and T; the caller evaluates them and
	 * refuses the mount with the reason where one is true), or NULL */
	const struct cJSON *refuse;
	/* "pp": pipeline stages (view_pp.c): served tensors named pp_layers<N>.<...> lie in the stage
	 * of layer N (N < config.json's pp_count); those starting with one of pp_first in the first
	 * stage, with one of pp_last in the last, with one of pp_every in every stage (vLLM's
	 * Qwen3-MoE builds its embedding, final norm and head on every stage); pp_types: the model
	 * types the stages are proven for. pp_layers NULL: the view has no stages (--pp refused). */
	const char *pp_layers, *pp_count;
	const char *pp_first[4], *pp_last[4], *pp_every[4], *pp_types[32];
	uint32_t npp_first, npp_last, npp_every, npp_types;
	const char *ep_types[32]; /* "ep": the model types whose expert parallelism (--ep) is probed */
	uint32_t nep_types;
	const char *ep_rr_types[32]; /* "ep_round_robin": those whose round_robin placement is (vLLM uses
	                             * it only for several expert groups, else it falls back to linear) */
	uint32_t nep_rr_types;
	const char *dp_ep_types[32]; /* "dp_ep": those whose data parallelism with expert parallelism
	                             * (--dp D --ep: experts over D x T ranks) is probed */
	uint32_t ndp_ep_types;
	/* "rules": plan rules (the plan file's format) for tensors the engine cuts otherwise than the
	 * plan does; put before the plan's own when the view is chosen (tp_mview_choose), so they
	 * win: an engine sizes its modules from the source's config.json, where a rank folder's model
	 * must be sized from its own (LFM2's short convolutions, whole in the plan, cut by channel in
	 * vLLM). NULL: the plan's cuts only. A child view's list replaces its parent's. */
	const struct cJSON *rules;
	int keep_rest;
	/* "rename": [{"from": P, "to": Q, "names": [TEMPLATE...]}]: a source tensor no entry uses whose
	 * name is P followed by one of the names (templates: {x} binds digits; no names: anything) is
	 * served as Q and that rest (the first pair that takes it, in order), keep_rest or not; a
	 * tensor no pair takes is kept or refused by keep_rest */
	const char *ren_from[TP_VIEW_RENAMES], *ren_to[TP_VIEW_RENAMES];
	const struct cJSON *ren_names[TP_VIEW_RENAMES]; /* NULL: every name under the prefix */
	uint32_t nren;
	int fragment;          /* "fragment": true: entries other views include ("include"), never chosen */
	tp_ventry *e;
	size_t ne;
} tp_view;

/* Parses a view file (text[0..len), named origin in messages). Returns 0, or -1 with e set. */
int tp_view_parse(const char *text, size_t len, const char *origin, tp_view *v, tp_err *e);
void tp_view_free(tp_view *v);

/* The view of engine `engine` for plan `plan`, config.json's model_type and its
 * quantization_config.quant_method (quant: NULL for an unquantized checkpoint): a built-in one
 * listing the plan, the model type (or none) and the quant method (a view without quant_methods
 * serves unquantized checkpoints only), or, when engine names a file (holds a '/' or ends in
 * .json), that file's text (text, len: read by the caller), held to the same plan and quant
 * method. Refuses, naming the plan, the model type and the quant method and saying that the hf
 * view (rank folders) serves it, when no view applies. */
int tp_view_choose(const char *engine, const char *text, size_t len, const char *plan, const char *model_type,
		   const char *quant, tp_view *v, tp_err *e);

/* One planned source file, as the view reads it. */
typedef struct tp_vsource {
	const char *path;      /* for messages */
	const st_header *h;
	const tp_spec *specs;  /* h->n specs, the plan's */
} tp_vsource;

/* The served tensors of one part. */
typedef struct tp_vpart {
	uint32_t file;         /* the source file whose part this is (an index into the sources) */
	uint32_t *srcs;        /* the sources its pieces read, sorted: tp_pdesc.file indexes this */
	uint32_t nsrc;
	tp_sdesc *d;
	size_t n, cap;
} tp_vpart;

typedef struct tp_vplan {
	tp_vpart *parts;       /* parts in source-file order; parts with no tensor are left out */
	size_t nparts;
	void **blocks;         /* owned: served names, piece arrays, constant bytes */
	size_t nblocks, capblocks;
	uint64_t ntensors, nconsts, nfused;
} tp_vplan;

/* A parsed view's entries as one checkpoint's config.json settles them (the caller evaluates them:
 * model_view.c): what tp_view_resolve reads besides the view, which nothing changes once parsed. */
typedef struct tp_vcfg {
	const struct tp_expr_ctx *cond_ctx; /* the config.json context (the plan's prefixes, the view's
	                                    * defaults, T...) per-match conditions read; NULL: every
	                                    * config key is missing */
	const uint8_t *off;                 /* [ne] or NULL: 1 where entry k's "if" (not per_match) is
	                                    * false: the entry is left out */
	const uint64_t (*dil_rows)[8];      /* [ne] or NULL: entry k's piece j's "deinterleave" rows N
	                                    * (0: none) */
} tp_vcfg;

/* Resolves view v, settled by cfg (NULL: every entry on, no deinterleave, no config.json), over
 * the nsrc planned source files. Returns 0, or -1 with e set: a piece missing for a binding
 * (unless optional), a stack with a missing member, two entries making one served name, a source
 * tensor no entry uses without keep_rest, out of memory. */
int tp_view_resolve(const tp_view *v, const tp_vcfg *cfg, const tp_vsource *src, uint32_t nsrc, tp_vplan *out,
		    tp_err *e);
void tp_vplan_free(tp_vplan *p);

/* ---- pipeline stages (view_pp.c) ---- */
#define TP_PP_MAX 64 /* pipeline stages */

/* The first layer of every stage as vLLM's get_pp_indices makes them (distributed/utils.py):
 * nlayers / P each, the remainder given one each to the stages before the last, counted back from
 * it; or given[0 .. P) layers each (--pp-layers, vLLM's VLLM_PP_LAYER_PARTITION), which must sum
 * to nlayers. start[0 .. P]: stage s holds [start[s], start[s + 1]). Refuses a stage without a
 * layer. Returns 0, or -1 with e set. */
int tp_pp_partition(uint64_t nlayers, uint32_t P, const uint32_t *given, uint64_t *start, tp_err *e);

#define TP_PP_EVERY 0x7fffffff /* tp_view_stage: the tensor is on every stage */

/* The stage of tensor `name` under view v's "pp" (start from tp_pp_partition, P stages): its
 * layer's, 0 / P - 1 for the first / last names, TP_PP_EVERY for the every names. Returns the
 * stage, or -1 with e set where the view's rules do not place the tensor (named, with the rules
 * it was held to) or its layer is past the last. */
int tp_view_stage(const tp_view *v, const char *name, uint32_t P, const uint64_t *start, tp_err *e);

/* A view's "rules" (v->rules) as a plan named name, to be extended by the plan it applies to
 * (tp_plan_extend: its rules then win); origin (the view's) prefixes messages. Returns 0 with p
 * set (freed by tp_plan_free), or -1 with e set. */
int tp_view_rules_plan(const struct cJSON *rules, const char *name, const char *origin, tp_plan *p, tp_err *e);

/* Whether s (NULL: never) is one of l[0 .. n). */
int tp_view_listed(const char *const *l, uint32_t n, const char *s);

/* Built-in view texts (the files of views/, embedded at build time). */
int tp_view_builtin_count(void);
const char *tp_view_builtin_text(int i, size_t *len);

#endif
