/* planner_stages.h: the state one tensor's resolution fills in, stage by stage (planner.h
 * lists the stages), shared by the files that hold them: planner_resolve.c (match, geometry,
 * distribution, spec, experts, and the pipeline) and planner_companions.c (reference and
 * companions, with the quantized companions table). Internal to the planner: nothing outside
 * those files includes it.
 */
#ifndef TP_PLANNER_STAGES_H
#define TP_PLANNER_STAGES_H

#include <stdint.h>

#include "planner.h"

/* The state the stages fill in, in order. */
typedef struct job {
	/* inputs */
	const tp_plan *pl;
	tp_expr_ctx *cfg;
	const st_tensor *t;
	tp_lookup_fn lookup;
	void *lctx;
	const tp_resolve_opts *o;
	const char *ctx;
	tp_err *e;
	char tctx[TP_ERR_MSG];        /* "FILE: tensor 'NAME'" */
	/* match */
	const tp_rule *r;
	const tp_split_kind_def *kind;
	int plen;                     /* bytes of the name the pattern covers (the module) */
	/* reference */
	char module[ST_MAX_NAME + 1];
	const char *role;             /* "" when the rule names the tensor itself */
	const st_tensor *ref;
	uint64_t packed;              /* logical values per stored element of ref's last axis (1, 2) */
	/* geometry */
	int64_t heads;
	int axis_ref;
	uint64_t L;                   /* logical length of the split axis */
	int64_t unit;
	tp_spec s;
	/* companions */
	int axis;
	uint64_t div;
} job;

/* Stage 2, reference: the module (j->plen bytes of the name), the tensor's role in it, the
 * reference tensor (looked up through j->lookup) and its packing (j->packed). */
void tp_stage_reference(job *j);

/* Stage 5a: which axis of this tensor is cut (the split kind's companion rule). Returns 1 when
 * the tensor stays whole (with out->why filled in), 0 with j->axis set, or -1 with j->e set. */
int tp_stage_companion_axis(job *j, tp_resolved *out);

/* Stage 5b: how many logical features one stored element of this tensor covers along the cut
 * axis (the quantized companions table, else the ratio of the shapes). Returns 1 when the
 * tensor is a broadcast (kept whole, out->why filled in), 0 with j->div set, or -1 with j->e set. */
int tp_stage_companion_divisor(job *j, tp_resolved *out);

#endif
