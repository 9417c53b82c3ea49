/* planner.h: from a plan and a checkpoint to one spec per tensor.
 *
 * Plan choice: a built-in plan by name, a plan file, or the built-in whose "detect" section
 * matches config.json. Resolution of one tensor is a short pipeline of named stages:
 *
 *   match       the first rule whose pattern covers the name and whose `when` holds
 *   reference   the module the rule names and its reference tensor (weight, weight_packed,
 *               qweight, or the tensor itself), and whether it is packed (two FP4 per byte)
 *   geometry    heads, units, segments and the logical axis length, from the rule's
 *               expressions, checked against the reference's shape
 *   distribution  uneven / replicated groups, vocabulary padding
 *   companions  which axis of this tensor is cut and how many logical features one stored
 *               element covers (the quantized companions table: FP8 block scales, NVFP4 group
 *               scales, broadcast scales)
 *   spec        the tp_spec and the one-line explanation `tpfs plan` shows
 *
 * Files: planner_choose.c (plan choice), planner_resolve.c (the pipeline, with the match,
 * geometry, distribution, spec and experts stages, and the per-rank check),
 * planner_companions.c (the reference and companions stages, with the packed formats and the
 * quantized companions table); planner_stages.h is the state they share.
 *
 * Errors: a rule that cannot be evaluated (an expression error, a key config.json lacks) is
 * TP_ERULE, its message starting "plan 'NAME', rule 'RULE' (FIELD): expression ..."; a tensor
 * that the rule cannot cut (shape disagreement, indivisible split) is TP_EPLAN.
 */
#ifndef TP_PLANNER_H
#define TP_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "plan_builtin.h"
#include "spec.h"
#include "st_format.h"
#include "tp_err.h"

struct cJSON;

/* ---- plan choice ---- */

/* Loads a built-in plan by name, following "extends" through other built-ins. */
int tp_plan_builtin(const char *name, tp_plan *p, tp_err *e);

/* Index of the first built-in plan whose detect section matches config (model_type or an
 * architecture, at the top level or under text_config), or -1. */
int tp_builtin_detect(const struct cJSON *config);

/* Chooses the plan for a checkpoint: want is NULL (detect from config, which may be NULL), the
 * name of a built-in, or a plan file path (anything with a '/' or ending in .json; a file may
 * extend a built-in). Writes a one-line account of the choice into origin ("built-in llama
 * (detected from config.json)"). Refuses a checkpoint whose config.json names no architecture
 * with a built-in plan, saying how to proceed (--plan FILE, or --plan generic). */
int tp_plan_choose(const struct cJSON *config, const char *want, tp_plan *p, char *origin, size_t n,
		   tp_err *e);

/* ---- resolution ---- */

/* Looks up another tensor of the checkpoint by name (for companions), or NULL. */
typedef const st_tensor *(*tp_lookup_fn)(void *ctx, const char *name);

typedef struct tp_resolve_opts {
	uint32_t T;
	uint64_t pad_vocab; /* 0: vocab rules must divide evenly; else pad to this multiple */
	int ep;             /* expert parallelism: the plan's experts declarations decide first (1: linear
	                     * placement, 2: round_robin, expert e on rank e % T) */
	int ep_uneven;      /* the experts' specs allow an uneven split (TP_UNEVEN: the first E mod N ranks
	                     * one expert more, vLLM's determine_expert_map): set under --dp */
	uint32_t D;         /* data-parallel ranks (--dp), 0 or 1: none; a rule's "when" sees it as DP (1
	                     * without --dp): vLLM holds some modules whole under DP x EP (deepseek_v3.json) */
} tp_resolve_opts;

#define TP_RULE_EXPERTS (-3) /* tp_resolved.rule when an experts declaration decided (--ep) */

/* What resolution decided for one tensor. */
typedef struct tp_resolved {
	tp_spec spec;
	int rule;            /* index into plan->rules, -1 when no rule matched, or TP_RULE_EXPERTS */
	int experts;         /* index into plan->experts of the declaration that names the tensor a
	                      * routed expert's, or -1 */
	char why[160];       /* e.g. "column, 32 heads of 128", "replicate (row-parallel bias)" */
	uint64_t logical;    /* logical axis length L (split tensors) */
} tp_resolved;

/* Resolves the spec of tensor t. cfg holds config.json and the plan's prefixes. Checks the
 * rule against the shapes (size, heads, segments, companions' divisors) and reports a mismatch
 * with the tensor, the rule, the expression, and both numbers. ctx prefixes messages (file
 * name). Distribution over T is checked later, by the layout (or tp_plan_check_ranks).
 * A tensor an experts declaration names gets TP_EXPERT in its spec's flags. Under o->ep that
 * declaration decides instead of the rules: a tensor of expert e (the {e} of the pattern) is
 * TP_OWNED by unit e of E; a fused experts tensor is split on its expert axis in E units of 1
 * (its size there must be E; a scalar is replicated). */
int tp_plan_resolve(const tp_plan *pl, tp_expr_ctx *cfg, const st_tensor *t, tp_lookup_fn lookup,
		    void *lctx, const tp_resolve_opts *o, const char *ctx, tp_resolved *out,
		    tp_err *e);

/* Expert parallelism over N ranks (T, or D x T under --dp): evaluates every experts
 * declaration's count into E[] (one per plan->experts; 0 for a count whose keys config.json
 * lacks: resolving a tensor that declaration matches then fails with TP_ERULE) and refuses a plan
 * that declares no routed experts, a count that fails otherwise (TP_ERULE), and an E that N does
 * not divide (TP_EPLAN, naming E and the values of N that work), or with uneven set (vLLM's
 * remainder rule) an E below N (a rank with no expert). */
int tp_plan_ep_check(const tp_plan *pl, tp_expr_ctx *cfg, uint32_t N, int uneven, int64_t *E, tp_err *e);

/* Cuts t under s for every rank of T (the check `tpfs plan` makes so that every tensor that
 * cannot be served is reported, not only the first). Returns 0, or -1 with the first refusal
 * plus the values of T that would work (and expert parallelism for experts) in e. ctx prefixes
 * messages. */
int tp_plan_check_ranks(const st_tensor *t, const tp_spec *s, uint32_t T, const char *ctx, tp_err *e);

#endif
