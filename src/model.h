/* model.h: one source checkpoint folder, planned for T ranks.
 *
 * tp_model_open walks SRC (following symbolic links, so a Hugging Face snapshot folder works: the
 * source tree, srctree.h), validates every safetensors header, reads config.json, picks and
 * resolves the plan, builds the layout of every safetensors file for every rank, and rewrites
 * every *.safetensors.index.json per rank, or under an engine view builds every view rank's part
 * files (model_view.h, told what it reads: it knows no model). Everything a mount serves is
 * decided here, before anything is mounted, and any failure names the file, the tensor and the
 * rule. The filesystem layer only reads the result.
 *
 * Policy for bad files: a safetensors file that is invalid (or unreadable) refuses the model
 * when it is needed (at the top level or listed by an index) or under --strict; otherwise it is
 * served unchanged with a warning. Unreadable or special non-tensor files, dangling links and
 * link loops are skipped with a warning.
 */
#ifndef TP_MODEL_H
#define TP_MODEL_H

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "layout.h"
#include "model_view.h"
#include "plan.h"
#include "planner.h"
#include "rank_folder.h"
#include "srctree.h"
#include "st_format.h"
#include "tp_err.h"
#include "view.h"

struct cJSON;
struct tp_model;

#define TP_MAX_CONFIG (16 << 20)   /* bytes of config.json */

typedef void (*tp_tensor_fn)(void *ctx, const struct tp_model *m, uint32_t node, uint32_t tensor,
			     const tp_resolved *res);

typedef struct tp_model_opts {
	const char *src;
	uint32_t T;
	const char *mnt;       /* the mount point (absolute, resolved), or NULL: a link into it
	                        * is refused (the mount would wait on itself) */
	const char *plan;      /* NULL: detect from config.json; a built-in name; or a file path */
	int strict;            /* unmatched tensors and any invalid file refuse the model */
	int unmatched_replicate; /* --unmatched replicate: a tensor no rule matches is served whole
	                        * (default: refused by name and shape, naming the per-rank count it
	                        * would contradict) */
	uint64_t pad_vocab;    /* 0 or a multiple (64 follows vLLM) */
	int check_only;        /* walk and validate headers only (tpfs check): never fails on a file */
	int config_global;     /* serve config.json unchanged in every rank folder (--config global) */
	int ep;                /* expert parallelism: routed experts whole, rank r holding [r*E/T, (r+1)*E/T)
	                        * (1, linear), or under a view experts r, r + T, ... (2, round_robin) */
	const char *view;      /* NULL: the hf view (rank folders); an engine ("vllm"), or a view file */
	uint32_t pp;           /* --pp: pipeline stages under the view (0 or 1: none) */
	uint32_t dp;           /* --dp: data-parallel ranks under the view with --ep (0 or 1: none): D groups
	                        * of T view ranks, g = d x T + t, dense tensors those of TP rank t, the
	                        * routed experts those of EP rank g of D x T (vLLM's DP with EP) */
	const uint32_t *pp_layers; /* --pp-layers: layers per stage (pp of them), or NULL: as vLLM divides them */
	int keep_going;        /* tpfs plan: report every tensor that cannot be cut (log level 2),
	                        * replicate it in the layouts, count it in nrefused, and go on */
	tp_log_fn log;
	tp_tensor_fn on_tensor;/* called for every resolved tensor (tpfs plan) */
	void *ctx;
} tp_model_opts;

typedef struct tp_model {
	char *src;             /* SRC as given */
	uint32_t T;
	tp_srctree tree;       /* SRC walked (srctree.h): tree.n[0] is the root */
	struct cJSON *config;  /* config.json of the root, or NULL */
	tp_plan plan;
	char plan_origin[256]; /* "built-in llama (detected from model_type 'llama')", a path, ... */
	int by_arch;           /* detection picked the plan through architectures alone: a tensor no
	                        * rule matches refuses the architecture as unknown */
	tp_expr_ctx cfg;
	uint64_t ntensors, nunmatched, ntensor_files;
	uint64_t nrefused;     /* keep_going: tensors that cannot be served at this T */
	uint64_t src_bytes;    /* data bytes of the planned safetensors files */
	int64_t ep_count[TP_MAX_EXPERT_DECLS]; /* --ep: E of each of the plan's experts declarations */
	uint64_t ep_tensors;   /* --ep: source tensors an experts declaration placed */
	const tp_model_opts *o;
	tp_rank_folder rf;       /* the resolved plan's digest and the rank metadata (rank_folder.h) */
	char *config_text;       /* the source's config.json (MNT/config.json), or NULL */
	size_t config_len;
	uint32_t config_node;    /* its node, or UINT32_MAX */
	uint64_t pad_vocab;      /* the vocabulary multiple planned with: o->pad_vocab, or the view's */
	/* --view: the engine view (model_view.h), chosen before planning, and every rank's served files,
	 * built after it; P stages of T ranks (P 1 without --pp) */
	tp_view *view;           /* NULL: the hf view */
	uint32_t P;              /* pipeline stages (--pp), 1 without */
	uint32_t D;              /* data-parallel ranks with --ep (--dp), 1 without: tp_mview says how they are served */
	tp_mview mv;
} tp_model;

/* Hands a message to the model's log callback (o->log), if any: level 0 warn, 1 info, 2 error. */
#define tp_model_log(m, level, ...) tp_logf((m)->o->log, (m)->o->ctx, (level), __VA_ARGS__)

/* Opens and plans SRC for o->T ranks. On failure returns -1 with a message; *m is then empty. */
int tp_model_open(tp_model *m, const tp_model_opts *o, tp_err *e);
void tp_model_close(tp_model *m);

/* Size of node i as rank r sees it. */
uint64_t tp_node_size(const tp_model *m, uint32_t i, uint32_t r);

/* Expert parallelism (--ep): the routed experts of the plan's experts declaration d that rank r
 * holds, [*first, *first + *count) (with --dp, r is the EP rank, of D x T). Both 0 without --ep. */
void tp_model_ep_range(const tp_model *m, int d, uint32_t r, uint64_t *first, uint64_t *count);

/* The name of view rank g's part file k: "model-rank-{g}-part-{k}.safetensors", or with stages
 * (P > 1) "model-pp-{s}-tp-{t}-part-{k}.safetensors" (vLLM's sharded_state patterns). */
void tp_model_view_name(const tp_model *m, uint32_t g, size_t k, char *out, size_t cap);

/* Whether view rank g has a part file k (a stage may have fewer parts than the view). */
int tp_model_view_slot(const tp_model *m, uint32_t g, size_t k);

/* The layers pipeline stage s holds under --pp: [*first, *end). */
void tp_model_stage_layers(const tp_model *m, uint32_t s, uint64_t *first, uint64_t *end);

/* ---- the served files, as the front ends (the file system, `tpfs plan`) reach them: only
 * through these; tests/py/test_seam.py fails on a front end that reads the view's fields ---- */

/* The ranks files are served for: the view's ranks (P x D x T: groups of T) under a view, else T. */
uint32_t tp_model_ranks(const tp_model *m);

/* The view's parts (0 without a view): rank g's file k is cut from one of them, and every rank's
 * file cut from part p reads the same sources, tp_model_view_part_nodes(p). */
size_t tp_model_view_parts(const tp_model *m);

/* Part p's sources as model nodes, *nsrc of them. */
const uint32_t *tp_model_view_part_nodes(const tp_model *m, size_t p, uint32_t *nsrc);

/* View rank g's part file k into *f (tp_view_file: model_view.h): 1, or 0 (f untouched) where g
 * has no file k. */
int tp_model_view_file(const tp_model *m, uint32_t g, size_t k, tp_view_file *f);

/* Per-rank value of a config count the plan lists under per_rank; -1 if missing. */
int64_t tp_model_rank_count(const tp_model *m, const tp_per_rank *pr, uint32_t r);

#endif
