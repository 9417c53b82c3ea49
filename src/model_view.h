/* model_view.h: an engine view over a planned source tree (--view), as a mount serves it.
 *
 * The plan says which bytes a rank owns; the view says how they are named and packed. Two steps,
 * each told everything it reads and returning everything it makes (model.c calls them; neither
 * knows the model): tp_mview_choose, once the plan is and before any tensor is planned, picks the
 * view for the plan and config.json (refusing what no view serves) and returns the vocabulary
 * multiple it asks for and the plan with the view's own rules before the plan's; tp_mview_build,
 * once every source file is planned (each keeping its specs), settles the view's entries for
 * config.json beside it (which apply, each piece's deinterleave rows, the refusals: a tp_vcfg;
 * the parsed view is never changed), resolves it over the source files a loader reads and builds
 * every view rank's part files (served.c) into a tp_mview. The rest reads a tp_mview: which rank
 * has which part file, its name, its bytes and sources.
 */
#ifndef TP_MODEL_VIEW_H
#define TP_MODEL_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "expr.h"
#include "plan.h"
#include "served.h"
#include "srctree.h"
#include "st_format.h"
#include "tp_err.h"
#include "view.h"

struct cJSON;

/* One part file of a view rank. */
typedef struct tp_view_file {
	const tp_served *layout; /* its bytes: size, header, the pieces of every tensor (served.h) */
	const tp_vpart *vpart;   /* the resolved part it is cut from: its tensors as the view made them */
	size_t part;             /* that part's number, below the view's parts */
	uint32_t nsrc;           /* the source files its pieces read, */
	const uint32_t *nodes;   /* [nsrc]: as source tree nodes, in the order its pieces number them */
	uint32_t own;            /* the node of the source file it is cut from (its owner, mode, mtime) */
} tp_view_file;

/* What tp_mview_choose reads. */
typedef struct tp_mview_choice {
	const char *view;             /* --view: an engine ("vllm") or a view file; NULL: the hf view */
	uint64_t pad_vocab;           /* --pad-vocab, or 0 */
	uint32_t P;                   /* pipeline stages (--pp), 1 without */
	uint32_t D;                   /* data-parallel ranks with --ep (--dp), 1 without */
	int ep;                       /* --ep: 0, 1 (linear) or 2 (round_robin) */
	const struct cJSON *config;   /* config.json, or NULL */
	tp_log_fn log;                /* the choice (level 1), or NULL */
	void *log_ctx;
} tp_mview_choice;

/* Picks the view for *plan and in->config into *view (NULL without in->view: then only --pp is
 * refused) and the vocabulary multiple to plan with into *pad_vocab (in->pad_vocab, or the
 * view's). A view with rules of its own puts them before *plan's (*plan is replaced, its strings
 * kept). Refuses a quantized checkpoint the view does not list, --ep, --pp or --dp for a model type
 * the view does not prove them for, and a --pad-vocab other than the view's. Returns 0, or -1 with e
 * set and *view NULL (*plan may then be consumed: tp_plan_extend; the caller frees it as ever). */
int tp_mview_choose(const tp_mview_choice *in, tp_plan *plan, tp_view **view, uint64_t *pad_vocab, tp_err *e);

/* What tp_mview_build reads. */
typedef struct tp_mview_in {
	const tp_view *view;          /* chosen by tp_mview_choose, read only: its entries' "if" and
	                               * "deinterleave" are evaluated beside it (tp_vcfg, view.h) */
	const tp_srctree *tree;       /* planned: every TN_TENSORS node's header and specs */
	uint32_t ntensor_files;       /* TN_TENSORS nodes in the tree */
	const struct cJSON *root_index; /* the root's model.safetensors.index.json, or NULL */
	const tp_expr_ctx *cfg;       /* config.json with the plan's prefixes */
	uint32_t T, P, D;             /* TP ranks, pipeline stages, data-parallel ranks (P x D x T view ranks;
	                               * P > 1 and D > 1 are not served together) */
	int ep;                       /* --ep: 0, 1 or 2 */
	const uint32_t *pp_layers;    /* --pp-layers (P of them), or NULL: as vLLM divides the layers */
	const st_meta *rank_meta;     /* 3 per TP rank: the metadata each part file carries (rank_folder.h) */
	tp_log_fn log;                /* what was built (level 1), or NULL */
	void *log_ctx;
} tp_mview_in;

/* The view's mount-time products. Pipeline stages (--pp): P stages of T ranks; view rank
 * g = s x T + t (stage s, TP rank t), as vLLM numbers its workers. Stage s's files are its
 * parts k < stage_np[s], each vplan part slot_part[s x nparts + k] cut for TP rank t and holding
 * the stage's tensors only. Without --pp: P 1, and slot k is part k.
 * Data parallelism with expert parallelism (--dp): D groups of T view ranks, g = d x T + t (vLLM's
 * EP rank), each holding every part: the dense tensors cut for TP rank t, the routed experts for
 * EP rank g of W = D x T (linear: the first E mod W ranks one more), files
 * "model-dp-{d}-rank-{t}-part-{k}.safetensors". D is 1 without --dp. G = P x D groups of T ranks,
 * each with its own stage_np and slot_part rows. All zero: no view. */
typedef struct tp_mview {
	uint32_t T, P, D, G, W;    /* TP ranks, stages, DP ranks, groups (P x D), view ranks (G x T) */
	uint64_t pp_start[TP_PP_MAX + 1]; /* stage s holds layers [pp_start[s], pp_start[s + 1]) */
	tp_vplan vplan;            /* the view resolved over the source files */
	uint32_t *src_node;        /* vplan's source index -> node */
	uint32_t **node;           /* [p]: part p's table of sources as nodes (src_node of its srcs) */
	uint32_t *stage_np;        /* [s]: per group */
	uint32_t *slot_part;       /* [s x nparts + k]: per group */
	tp_served *vs;             /* [g x vplan.nparts + k]: view rank g's part file k */
} tp_mview;

/* Builds *out (zeroed first) from in. Returns 0, or -1 with e set naming the view and its entry
 * or the tensor; *out then holds what was built, for tp_mview_free. */
int tp_mview_build(const tp_mview_in *in, tp_mview *out, tp_err *e);

/* Frees what tp_mview_build made (not the view); *v is zeroed. */
void tp_mview_free(tp_mview *v);

/* The name of view rank g's part file k: "model-rank-{g}-part-{k}.safetensors", or with stages
 * (P > 1) "model-pp-{s}-tp-{t}-part-{k}.safetensors" (vLLM's sharded_state patterns), or with
 * data-parallel ranks (D > 1) "model-dp-{d}-rank-{t}-part-{k}.safetensors" (sharded_state's
 * reading with the pattern "model-dp-{d}-rank-{rank}-part-{part}.safetensors"). */
void tp_mview_name(uint32_t T, uint32_t P, uint32_t D, uint32_t g, size_t k, char *out, size_t cap);

/* Whether view rank g has a part file k (a stage may have fewer parts than the view). */
int tp_mview_slot(const tp_mview *v, uint32_t g, size_t k);

/* View rank g's part file k into *f: 1, or 0 (f untouched) where g has no file k. */
int tp_mview_file(const tp_mview *v, uint32_t g, size_t k, tp_view_file *f);

#endif
