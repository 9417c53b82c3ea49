/* planner_resolve.c: per-tensor resolution (see planner.h): the pipeline of stages and the
 * stages that read the rule (match, geometry, distribution, spec), the routed experts'
 * declarations (expert parallelism), and the check of a spec on every rank.
 *
 * Resolution works on the MODULE a rule names: its reference tensor fixes the split axis and
 * the logical length L of that axis. Every tensor of the module is then cut at the same logical
 * indices: which of its axes is cut is the split kind's companion rule (plan.h), and how many
 * logical features one stored element covers comes from the quantized companions table
 * (planner_companions.c: FP8 block scales, NVFP4 group scales), or else from the ratio of L to
 * the stored length (a companion whose axis has 1 element is broadcast, kept whole). Scalars
 * are replicated.
 */
#include "planner_stages.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An expression of the rule that must be a positive integer; an error is the plan's (TP_ERULE),
 * prefixed with the plan, the rule, the field and the tensor. */
static int eval_pos(job *j, const char *src, int64_t *v, const char *what)
{
	tp_err *e = j->e;
	int rc = tp_expr_int(j->cfg, src, v, e);
	if (rc == 0 && *v <= 0)
		rc = tp_fail(e, TP_ERULE, "expression '%s' is %lld, not positive", src, (long long)*v);
	if (rc != 0) {
		tp_err_prefix(e, "%s: plan '%s', rule '%s' (%s)", j->tctx, j->pl->name, j->r->name, what);
		e->code = TP_ERULE;
		return -1;
	}
	return 0;
}

/* Stage 1, match: the first rule whose pattern covers the name and whose `when` holds (`when`
 * sees T and DP, the data-parallel ranks: 1 without --dp). Returns 1 (a rule), 0 (none), or -1
 * (a `when` that cannot be evaluated). */
static int stage_match(job *j, tp_resolved *out)
{
	const tp_plan *pl = j->pl;
	for (int i = 0; i < pl->nrules; i++) {
		for (int k = 0; k < pl->rules[i].npat; k++) {
			j->cfg->nvar = 0;
			tp_expr_bind(j->cfg, "T", j->o->T);
			tp_expr_bind(j->cfg, "DP", j->o->D > 1 ? j->o->D : 1);
			int plen = tp_pattern_match(pl->rules[i].pat[k], j->t->name, j->cfg);
			if (plen < 0)
				continue;
			if (pl->rules[i].when) {
				int c = tp_expr_cond(j->cfg, pl->rules[i].when, j->e);
				if (c < 0) {
					tp_err_prefix(j->e, "%s: plan '%s', rule '%s' (when)", j->tctx, pl->name, pl->rules[i].name);
					return -1;
				}
				if (!c)
					continue;
			}
			j->r = &pl->rules[i];
			j->kind = tp_split_kind(j->r->split);
			j->plen = plen;
			out->rule = i;
			return 1;
		}
	}
	return 0;
}

/* The reference axis under the rule's split kind. */
static int reference_axis(job *j)
{
	const tp_rule *r = j->r;
	const st_tensor *t = j->ref;
	switch (j->kind->ref) {
	case TK_AX_FIRST:
		return t->ndim >= 1 ? 0 : tp_fail(j->e, TP_EPLAN, "%s (rule '%s'): a scalar has no dim 0 to split", j->tctx, r->name);
	case TK_AX_LAST:
		return t->ndim >= 1 ? (int)t->ndim - 1
				    : tp_fail(j->e, TP_EPLAN, "%s (rule '%s'): a scalar has no last dim to split", j->tctx, r->name);
	case TK_AX_RULE: {
		int a = r->axis < 0 ? (int)t->ndim + r->axis : r->axis;
		if (a < 0 || a >= (int)t->ndim)
			return tp_fail(j->e, TP_EPLAN, "%s (rule '%s'): axis %d is out of range for %u dimensions", j->tctx,
				       r->name, r->axis, t->ndim);
		return a;
	}
	case TK_AX_HEADS: {
		int found = -1, count = 0;
		if (r->axis_pref) { /* the preferred axis, where it has the size; otherwise the one other that has */
			int a = r->axis < 0 ? (int)t->ndim + r->axis : r->axis;
			if (a >= 0 && a < (int)t->ndim && t->shape[a] == (uint64_t)j->heads)
				return a;
		}
		for (uint32_t i = 0; i < t->ndim; i++)
			if (t->shape[i] == (uint64_t)j->heads) {
				found = (int)i;
				count++;
			}
		if (count != 1)
			return tp_fail(j->e, TP_EPLAN, "%s (rule '%s'): %s axis has size %lld (heads) in shape of %u dimensions",
				       j->tctx, r->name, count ? "more than one" : "no", (long long)j->heads, t->ndim);
		return found;
	}
	case TK_AX_NONE:
	case TK_AX_REFUSE:
		break;
	}
	return tp_fail(j->e, TP_ERULE, "%s: plan '%s', rule '%s': split kind '%s' has no axis", j->tctx, j->pl->name,
		       r->name, j->kind->name);
}

/* Stage 3, geometry: heads, the reference axis, the logical length L (cross-checked against
 * "size"), the unit width and the segments, into j->s. */
static int stage_geometry(job *j)
{
	const tp_rule *r = j->r;
	const char *tctx = j->tctx;
	tp_err *e = j->e;
	j->heads = 0;
	if (r->heads && eval_pos(j, r->heads, &j->heads, "heads") < 0)
		return -1;
	j->axis_ref = reference_axis(j);
	if (j->axis_ref < 0)
		return -1;
	const st_tensor *ref = j->ref;
	uint64_t S_ref = ref->shape[j->axis_ref];
	if (j->axis_ref != (int)ref->ndim - 1)
		j->packed = 1; /* packing is along the last axis only */
	uint64_t L = S_ref * j->packed;
	if (r->div) {
		/* an explicit divisor (resolved plans): size gives L, default S * div */
		int64_t sz = (int64_t)(S_ref * (uint64_t)r->div);
		if (r->size && eval_pos(j, r->size, &sz, "size") < 0)
			return -1;
		L = (uint64_t)sz;
	} else if (r->size) {
		int64_t sz;
		if (eval_pos(j, r->size, &sz, "size") < 0)
			return -1;
		if ((uint64_t)sz != L)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d of '%s' holds %llu features but '%s' = %lld (%s)",
				       tctx, r->name, j->axis_ref, ref->name, (unsigned long long)L, r->size,
				       (long long)sz, tp_expr_used(j->cfg)[0] ? j->cfg->used : "no config keys");
	}
	j->L = L;

	/* units and segments, in logical features */
	int64_t unit = 1;
	if (r->heads) {
		if (L % (uint64_t)j->heads)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d of '%s' holds %llu features, not a multiple of %lld heads ('%s'; %s)",
				       tctx, r->name, j->axis_ref, ref->name, (unsigned long long)L, (long long)j->heads,
				       r->heads, tp_expr_used(j->cfg)[0] ? j->cfg->used : "no config keys");
		unit = (int64_t)(L / (uint64_t)j->heads);
	} else if (r->unit && eval_pos(j, r->unit, &unit, "unit") < 0) {
		return -1;
	}
	j->unit = unit;
	tp_spec *s = &j->s;
	*s = tp_spec_replicate();
	s->kind = TP_SPLIT;
	s->unit = (uint64_t)unit;
	if (r->nseg) {
		unsigned long long sum = 0;
		for (int i = 0; i < r->nseg; i++) {
			int64_t v, u = unit;
			if (eval_pos(j, r->seg[i], &v, "segments") < 0)
				return -1;
			if (r->seg_heads[i]) {
				int64_t h;
				if (eval_pos(j, r->seg_heads[i], &h, "segment heads") < 0)
					return -1;
				if (v % h)
					return tp_fail(e, TP_EPLAN,
						       "%s (rule '%s'): segment %d ('%s' = %lld) is not a multiple of %lld heads ('%s')",
						       tctx, r->name, i, r->seg[i], (long long)v, (long long)h, r->seg_heads[i]);
				u = v / h;
			} else if (r->seg_unit[i] && eval_pos(j, r->seg_unit[i], &u, "segment unit") < 0) {
				return -1;
			}
			if (v % u)
				return tp_fail(e, TP_EPLAN,
					       "%s (rule '%s'): segment %d ('%s' = %lld) is not a whole number of units of %lld",
					       tctx, r->name, i, r->seg[i], (long long)v, (long long)u);
			s->seg[i] = (uint64_t)(v / u);
			s->segu[i] = u == unit ? 0 : (uint64_t)u;
			if (tp_add64(sum, (unsigned long long)v, &sum) < 0)
				return tp_fail(e, TP_EPLAN, "%s (rule '%s'): segments overflow", tctx, r->name);
		}
		s->nseg = (uint32_t)r->nseg;
		if (sum != L)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): segments sum to %llu but axis %d of '%s' holds %llu features",
				       tctx, r->name, (unsigned long long)sum, j->axis_ref, ref->name,
				       (unsigned long long)L);
	} else {
		if (L % (uint64_t)unit)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d of '%s' holds %llu features, not a multiple of the unit %lld",
				       tctx, r->name, j->axis_ref, ref->name, (unsigned long long)L, (long long)unit);
		s->nseg = 1;
		s->seg[0] = L / (uint64_t)unit;
	}
	return 0;
}

/* Stage 4, distribution: uneven splits and replicated groups as the rule allows, and the
 * vocabulary's padding (or its refusal, with the way out). */
static int stage_distribution(job *j)
{
	const tp_rule *r = j->r;
	tp_spec *s = &j->s;
	s->flags = (r->uneven ? TP_UNEVEN : 0) | (r->groups ? TP_GROUPS : 0);
	if (!r->vocab)
		return 0;
	if (j->o->pad_vocab > 1) {
		s->pad_to = j->o->pad_vocab;
	} else if (j->L / (uint64_t)j->unit % j->o->T) {
		uint64_t rows = j->L / (uint64_t)j->unit, padded = (rows + 63) / 64 * 64;
		return tp_fail(j->e, TP_EPLAN, "%s (rule '%s'): the vocabulary of %llu rows does not divide over %u ranks%s",
			       j->tctx, r->name, (unsigned long long)rows, j->o->T,
			       padded % j->o->T ? " (nor does it padded to a multiple of 64: choose another T)"
						: "; pass --pad-vocab to pad it to a multiple of 64 as vLLM does");
	}
	return 0;
}

/* Stage 6, spec: the tp_spec of this tensor and the line `tpfs plan` shows. */
static void stage_spec(job *j, tp_resolved *out)
{
	tp_spec s = j->s;
	s.axis = (uint32_t)j->axis;
	s.div = j->div;
	out->spec = s;
	out->logical = j->L;
	const tp_rule *r = j->r;
	int w = 0;
	char buf[160];
	if (j->kind->ref == TK_AX_RULE) /* "axis 1", not "axis axis 1" */
		w = snprintf(buf, sizeof buf, "axis %d", j->axis);
	else if (j->kind->ref == TK_AX_HEADS)
		w = snprintf(buf, sizeof buf, "%s axis %d", j->kind->label, j->axis);
	else
		w = snprintf(buf, sizeof buf, "%s", j->kind->label);
	if (s.nseg > 1) {
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", segments");
		for (uint32_t i = 0; i < s.nseg && w < 100; i++)
			w += snprintf(buf + w, sizeof buf - (size_t)w, "%s%llux%llu", i ? "|" : " ", (unsigned long long)s.seg[i],
				      (unsigned long long)(s.segu[i] ? s.segu[i] : s.unit));
	} else {
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", %llu %s of %llu", (unsigned long long)s.seg[0],
			      r->heads ? "heads" : "units", (unsigned long long)s.unit);
	}
	if (s.div > 1 && w < 140)
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", %llu per element", (unsigned long long)s.div);
	if (s.pad_to && w < 140)
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", padded to %llu", (unsigned long long)s.pad_to);
	if (s.flags & TP_UNEVEN && w < 150)
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", uneven");
	if (s.flags & TP_GROUPS && w < 150)
		snprintf(buf + w, sizeof buf - (size_t)w, ", groups");
	memcpy(out->why, buf, sizeof out->why);
}

/* ======================= routed experts (expert parallelism) ======================= */

static int resolve_rules(job *j, tp_resolved *out);

/* The value the last pattern match bound to variable v, or -1. */
static int64_t bound_var(const tp_expr_ctx *c, const char *v)
{
	for (int i = 0; i < c->nvar; i++)
		if (strcmp(c->var[i], v) == 0)
			return c->val[i];
	return -1;
}

/* Evaluates the count of experts declaration x (a positive E). ctx prefixes messages. */
static int experts_count(const tp_plan *pl, const tp_experts *x, tp_expr_ctx *cfg, const char *ctx, int64_t *E,
			 tp_err *e)
{
	int rc = tp_expr_int(cfg, x->count, E, e);
	if (rc == 1)
		rc = tp_fail(e, TP_ERULE, "expression '%s' is missing from config.json", x->count);
	else if (rc == 0 && *E <= 0)
		rc = tp_fail(e, TP_ERULE, "expression '%s' is %lld, not positive", x->count, (long long)*E);
	if (rc != 0) {
		tp_err_prefix(e, "%s%splan '%s', experts '%s' (count)", ctx, *ctx ? ": " : "", pl->name, x->name);
		e->code = TP_ERULE;
		return -1;
	}
	return 0;
}

/* Stage 0, experts: the first experts declaration whose pattern covers the name. Sets
 * out->experts. Under --ep the declaration decides the spec: returns 1 with out filled in.
 * Returns 0 when the rules decide, -1 on error. */
static int stage_experts(job *j, tp_resolved *out)
{
	const tp_plan *pl = j->pl;
	const st_tensor *t = j->t;
	for (int d = 0; d < pl->nexperts; d++) {
		const tp_experts *x = &pl->experts[d];
		for (int k = 0; k < x->npat; k++) {
			j->cfg->nvar = 0;
			tp_expr_bind(j->cfg, "T", j->o->T);
			if (tp_pattern_match(x->pat[k], t->name, j->cfg) < 0)
				continue;
			out->experts = d;
			if (!j->o->ep)
				return 0;
			int per_expert = strstr(x->pat[k], "{e}") != NULL;
			int64_t ei = per_expert ? bound_var(j->cfg, "e") : 0, E;
			if (experts_count(pl, x, j->cfg, j->tctx, &E, j->e) < 0)
				return -1;
			out->rule = TP_RULE_EXPERTS;
			if (per_expert) {
				if (ei < 0 || ei >= E)
					return tp_fail(j->e, TP_EPLAN,
						       "%s (experts '%s'): expert %lld, but '%s' = %lld routed experts (%s)", j->tctx,
						       x->name, (long long)ei, x->count, (long long)E,
						       tp_expr_used(j->cfg)[0] ? j->cfg->used : "no config keys");
				out->spec = tp_spec_owned((uint64_t)E, (uint64_t)ei);
				out->spec.flags = TP_EXPERT | (j->o->ep == 2 ? TP_EP_RR : 0) | (j->o->ep_uneven ? TP_UNEVEN : 0);
				tp_fmt(out->why, sizeof out->why, "expert %lld of %lld, whole on its rank (--ep%s)", (long long)ei,
				       (long long)E, j->o->ep == 2 ? "=round_robin" : "");
				return 1;
			}
			if (j->o->ep == 2)
				return tp_fail(j->e, TP_EPLAN, "%s (experts '%s'): one tensor holds every expert; --ep=round_robin "
					       "places them strided over the ranks, which a cut of it cannot serve; use --ep "
					       "(linear)", j->tctx, x->name);
			if (t->ndim == 0) {
				out->spec = tp_spec_replicate();
				out->spec.flags = TP_EXPERT;
				tp_fmt(out->why, sizeof out->why, "replicate (a scalar shared by the experts)");
				return 1;
			}
			int a = x->axis < 0 ? (int)t->ndim + x->axis : x->axis;
			if (a < 0 || a >= (int)t->ndim)
				return tp_fail(j->e, TP_EPLAN, "%s (experts '%s'): expert axis %d is out of range for %u dimensions",
					       j->tctx, x->name, x->axis, t->ndim);
			if (t->shape[a] != (uint64_t)E)
				return tp_fail(j->e, TP_EPLAN,
					       "%s (experts '%s'): axis %d holds %llu experts but '%s' = %lld (%s)", j->tctx,
					       x->name, a, (unsigned long long)t->shape[a], x->count, (long long)E,
					       tp_expr_used(j->cfg)[0] ? j->cfg->used : "no config keys");
			out->spec = tp_spec_split((uint32_t)a, (uint64_t)E, 1);
			out->spec.flags = TP_EXPERT | (j->o->ep_uneven ? TP_UNEVEN : 0);
			out->logical = (uint64_t)E;
			tp_fmt(out->why, sizeof out->why, "experts axis %d, %lld experts, whole ones per rank (--ep)", a,
			       (long long)E);
			return 1;
		}
	}
	return 0;
}

int tp_plan_ep_check(const tp_plan *pl, tp_expr_ctx *cfg, uint32_t T, int uneven, int64_t *E, tp_err *e)
{
	if (!pl->nexperts)
		return tp_fail(e, TP_EINVAL,
			       "--ep: plan '%s' declares no routed experts (it has no \"experts\" section), so expert "
			       "parallelism has nothing to place; a plan file can declare them (docs/PLANS.md)",
			       pl->name);
	for (int d = 0; d < pl->nexperts; d++) {
		const tp_experts *x = &pl->experts[d];
		cfg->nvar = 0;
		tp_expr_bind(cfg, "T", T);
		E[d] = 0;
		if (tp_expr_int(cfg, x->count, &E[d], e) == 1) {
			E[d] = 0; /* a declaration this config does not size (one a plan inherited): an
			           * expert tensor it matches is refused when resolved */
			continue;
		}
		if (experts_count(pl, x, cfg, "--ep", &E[d], e) < 0)
			return -1;
		if ((uint64_t)E[d] % T == 0)
			continue;
		if (uneven && (uint64_t)E[d] >= T)
			continue; /* the first E mod N ranks hold one expert more (vLLM's determine_expert_map) */
		if (uneven)
			return tp_fail(e, TP_EPLAN, "--ep: %lld routed experts (plan '%s', experts '%s') over %u ranks "
				       "(--dp x --tp) leave a rank without an expert: give at most %lld ranks",
				       (long long)E[d], pl->name, x->name, T, (long long)E[d]);
		char ns[256] = "";
		size_t w = 0;
		int k = 0;
		for (int64_t n = 1; n <= E[d] && n <= TP_MAX_T; n++)
			if (E[d] % n == 0 && w < sizeof ns) {
				tp_fmt(ns + w, sizeof ns - w, "%s%lld", k++ ? ", " : "", (long long)n);
				w += strlen(ns + w);
			}
		char used[sizeof cfg->used];
		tp_fmt(used, sizeof used, "%s", tp_expr_used(cfg));
		return tp_fail(e, TP_EPLAN,
			       "--ep: %lld routed experts (%s; plan '%s', experts '%s') do not divide over %u "
			       "ranks: rank r holds experts [r*E/N, (r+1)*E/N), so N must divide %lld: --tp %s",
			       (long long)E[d], used[0] ? used : x->count, pl->name, x->name, T, (long long)E[d], ns);
	}
	return 0;
}

int tp_plan_resolve(const tp_plan *pl, tp_expr_ctx *cfg, const st_tensor *t, tp_lookup_fn lookup,
		    void *lctx, const tp_resolve_opts *o, const char *ctx, tp_resolved *out, tp_err *e)
{
	memset(out, 0, sizeof *out);
	out->spec = tp_spec_replicate();
	out->rule = -1;
	out->experts = -1;
	job jb = {.pl = pl, .cfg = cfg, .t = t, .lookup = lookup, .lctx = lctx, .o = o, .ctx = ctx, .e = e};
	job *j = &jb;
	tp_fmt(j->tctx, sizeof j->tctx, "%s: tensor '%s'", ctx, t->name);
	int rc = stage_experts(j, out);
	if (rc != 0)
		return rc < 0 ? -1 : 0;
	rc = resolve_rules(j, out);
	if (out->experts >= 0)
		out->spec.flags |= TP_EXPERT;
	return rc;
}

/* Stages 1-6: the rules decide. */
static int resolve_rules(job *j, tp_resolved *out)
{
	const tp_plan *pl = j->pl;
	const st_tensor *t = j->t;
	tp_err *e = j->e;
	int rc = stage_match(j, out);
	if (rc <= 0) {
		if (rc == 0)
			tp_fmt(out->why, sizeof out->why, "replicate (no rule matched)");
		return rc;
	}
	rc = 0;
	if (j->kind->ref == TK_AX_REFUSE) {
		rc = tp_fail(e, TP_EPLAN, "%s (rule '%s'): refused by plan '%s': %s", j->tctx, j->r->name, pl->name,
			     j->r->reason);
	} else if (j->kind->ref == TK_AX_NONE) {
		tp_fmt(out->why, sizeof out->why, "replicate");
	} else if (st_numel(t) == 1 && j->r->div == 0) {
		tp_fmt(out->why, sizeof out->why, "replicate (scalar)");
	} else {
		tp_stage_reference(j);
		rc = stage_geometry(j);
		if (rc == 0)
			rc = stage_distribution(j);
		if (rc == 0)
			rc = tp_stage_companion_axis(j, out);
		if (rc == 0)
			rc = tp_stage_companion_divisor(j, out);
		if (rc == 0)
			stage_spec(j, out);
		if (rc > 0) { /* whole: the rule matched but this tensor stays whole */
			out->spec = tp_spec_replicate();
			out->logical = j->L;
			rc = 0;
		}
	}
	return rc;
}

int tp_plan_check_ranks(const st_tensor *t, const tp_spec *s, uint32_t T, const char *ctx, tp_err *e)
{
	int aff = tp_spec_affine(s, T); /* ranks 0, 1 and T-1 stand for all */
	for (uint32_t r = 0; r < T; r = aff && r == 1 ? T - 1 : r + 1) {
		tp_cut c;
		if (tp_cut_tensor(t, s, T, r, &c, ctx, e) == 0)
			continue;
		char ts[96], msg[TP_ERR_MSG];
		tp_spec_working_ts(t, s, 64, ts, sizeof ts);
		tp_fmt(msg, sizeof msg, "%s", e->msg);
		tp_fmt(e->msg, sizeof e->msg, "%s; this tensor can be split for T = %s%s", msg, ts,
		       (s->flags & TP_EXPERT) && s->kind != TP_OWNED ? "; or serve the experts with expert parallelism (--ep)" : "");
		return -1;
	}
	return 0;
}
