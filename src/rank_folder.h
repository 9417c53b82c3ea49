/* rank_folder.h: what makes a rank folder stand alone.
 *
 * A TP=1 loader pointed at MNT/rank{r} must build exactly the served shapes and be able to tell
 * which split it holds. After planning, this module
 *   - digests the resolved plan (the rules `tpfs plan --json` prints, one exact rule per
 *     tensor, and the per_rank keys) with SHA-256, and gives every rank file's header the __metadata__ entries
 *     tpfs.tp_size, tpfs.tp_rank and tpfs.plan ("<plan name> sha256:<hex>"), the source's own
 *     entries kept; under --ep also tpfs.ep_size (N, the tp size) and tpfs.ep_experts, the
 *     rank's routed experts as an inclusive range of global expert numbers, "8-15" (distinct
 *     ranges of several experts declarations joined by ",");
 *   - writes each rank's config.json (unless the model was opened with config_global): every
 *     count the plan lists under per_rank, at the top level and under each config_prefix
 *     (text_config), replaced by the rank's own value; every other byte kept (rank_config.h).
 *     Under --ep a count that sizes a routed expert (named by the rule that would cut a routed
 *     expert's tensor without --ep: moe_intermediate_size) keeps the source's value, and the top
 *     level gets "tpfs_ep_size": N and "tpfs_ep_experts": "8-15".
 * It works on what tp_model_open has planned, handed over as a tp_rf_in (the plan, the config,
 * the safetensors files and their layouts), and knows neither the model's tree nor FUSE.
 */
#ifndef TP_RANK_FOLDER_H
#define TP_RANK_FOLDER_H

#include <stddef.h>
#include <stdint.h>

#include "expr.h"
#include "layout.h"
#include "plan.h"
#include "planner.h"
#include "st_format.h"
#include "tp_err.h"

struct cJSON;

/* What this module keeps for a model: the resolved rules while planning, then the digest and
 * the rank metadata every rank file's layout points to (so it lives as long as the layouts). */
typedef struct tp_rank_folder {
	char **resolved;         /* while planning: per node, its rules of the resolved plan (JSON
	                          * objects joined by commas) */
	uint32_t nresolved;      /* entries of resolved (the model's nodes) */
	int resolved_failed;     /* a rule could not be kept (out of memory) */
	char *plan_tag;          /* "<plan name> sha256:<hex of the resolved plan>" */
	st_meta *rank_meta;      /* 3 per rank: tpfs.plan, tpfs.tp_rank, tpfs.tp_size (5 under --ep:
	                          * then tpfs.ep_size, tpfs.ep_experts) */
	char (*rank_num)[12];    /* T + 1 strings: each rank's number, then T */
	char (*rank_ep)[160];    /* --ep: T strings, each rank's expert range ("8-15") */
} tp_rank_folder;

/* One planned safetensors file. */
typedef struct tp_rf_file {
	const st_header *h;
	tp_layout *lay;          /* its T layouts (given the rank metadata), or NULL */
} tp_rf_file;

/* What tp_rank_folder_build reads. */
typedef struct tp_rf_in {
	const tp_plan *plan;
	const tp_expr_ctx *cfg;  /* config.json with the plan's prefixes */
	uint32_t T;
	uint64_t pad_vocab;
	int ep, config_global, keep_going; /* as tp_model_opts has them */
	const int64_t *ep_count; /* --ep: E of each of the plan's experts declarations */
	tp_log_fn log;           /* notes (level 1), or NULL */
	void *log_ctx;
	const tp_rf_file *files; /* every planned safetensors file, in the model's node order */
	size_t nfiles;
	const struct cJSON *config; /* the root's config.json, parsed, or NULL */
	int config_plain;        /* the root has a config.json served from the source (not an index,
	                          * folder or tensors file) */
	const char *config_text; /* the text it was parsed from, or NULL */
	size_t config_len;
	uint64_t config_size;    /* its size at the walk */
} tp_rf_in;

/* A growing text; out of memory sticks (oom set; later appends do nothing). */
typedef struct tp_text {
	char *p;
	size_t len, cap;
	int oom;
} tp_text;

/* Where tensor i's rule lies in a tp_text: [a, b), or a = SIZE_MAX when it has none (not
 * resolved, or out of memory). */
typedef struct tp_span {
	size_t a, b;
} tp_span;

/* Appends tensor t's rule of the resolved plan to b, as `tpfs plan --json` lists it (an exact
 * match, replicate or an axis split with its unit, size, divisor, segments and flags), in the
 * bytes cJSON_PrintUnformatted gives that object (its number and string formats, so that the
 * digest is that of `tpfs plan --json`'s rules); nothing for a routed expert placed by an
 * experts declaration (--ep), which the rules leave out. Writing text instead of building
 * cJSON objects was a seventh of planning a 200k-tensor checkpoint. */
void tp_resolved_rule(tp_text *b, const tp_plan *pl, const st_tensor *t, const tp_resolved *res);

/* The plan's experts declarations as `tpfs plan --json` prints them ("experts": [{name, match,
 * count, axis}]), an array (empty when it has none); NULL when out of memory. */
struct cJSON *tp_experts_json(const tp_plan *pl);

/* Takes the rules of the tensors of node idx (of nn nodes), whose header is h (tensor i's rule
 * at sp[i] in b), in the order `tpfs plan --json` lists them (names descending), for the
 * digest. Frees b's text and sp. */
void tp_resolved_keep(tp_rank_folder *rf, uint32_t nn, uint32_t idx, const st_header *h, tp_text *b, tp_span *sp);

/* The content of the resolved plan, whose SHA-256 is the digest in tpfs.plan: the compact JSON
 * (no spaces, members in the order `tpfs plan --json` prints them) of {"per_rank": [...],
 * "rules": [...]} as that output holds them, and under --ep (when the plan declares experts)
 * "experts": [...] after them, so that a mount with --ep never shares the digest of one
 * without (its rules then leave out the routed experts, which the declarations place). The name, description and source path are left
 * out, so the same split of the same tensors has the same digest wherever it is mounted from
 * and whichever plan file (a built-in or its resolved copy) produced it. In Python:
 *   json.dumps({"per_rank": p.get("per_rank", []), "rules": p["rules"]},
 *              separators=(",", ":"), ensure_ascii=False)
 * with "experts": p["experts"] added last under --ep. Consumes the rules kept by tp_resolved_keep. Returns a malloc'd string, or NULL when out of
 * memory. */
char *tp_resolved_plan_text(tp_rank_folder *rf, const tp_plan *pl, int ep);

/* Expert parallelism: the routed experts [*first, *first + *count) that rank r of T holds of E
 * (the layouts' distribution); both 0 when E <= 0 or r >= T. */
void tp_ep_range(int64_t E, uint32_t T, uint32_t r, uint64_t *first, uint64_t *count);

/* After planning: the plan digest, the rank metadata of every layout, and (unless
 * in->config_global, or in->keep_going) every rank's config.json, written into *gen / *gen_len
 * (arrays of T, allocated here; on failure what was allocated is left there for the caller to
 * free), *rewritten then set to 1 (else left alone). Returns 0, or -1 with a message naming the key that
 * cannot be given a rank's value and why. */
int tp_rank_folder_build(tp_rank_folder *rf, const tp_rf_in *in, char ***gen, uint64_t **gen_len, int *rewritten,
			 tp_err *e);

/* Frees what tp_rank_folder_build (and tp_resolved_keep) allocated in rf. */
void tp_rank_folder_free(tp_rank_folder *rf);

#endif
