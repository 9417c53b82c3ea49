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
 * It works on a tp_model that tp_model_open has planned, and knows nothing of FUSE.
 */
#ifndef TP_RANK_FOLDER_H
#define TP_RANK_FOLDER_H

#include "model.h"

struct cJSON;

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

/* Takes the rules of node idx's tensors (tensor i's at sp[i] in b), in the order `tpfs plan
 * --json` lists them (names descending), for the digest. Frees b's text and sp. */
void tp_resolved_keep(tp_model *m, uint32_t idx, tp_text *b, tp_span *sp);

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
char *tp_resolved_plan_text(tp_model *m);

/* After planning: the plan digest, the rank metadata of every layout, and (unless
 * m->o->config_global) every rank's config.json. Returns 0, or -1 with a message naming the
 * key that cannot be given a rank's value and why. */
int tp_rank_folder_build(tp_model *m, tp_err *e);

/* Frees what tp_rank_folder_build (and tp_resolved_keep) allocated in m. */
void tp_rank_folder_free(tp_model *m);

#endif
