/* planner.c: plan choice and per-tensor resolution (see planner.h).
 *
 * Resolution works on the MODULE a rule names: its reference tensor fixes the split axis and
 * the logical length L of that axis. Every tensor of the module is then cut at the same logical
 * indices: which of its axes is cut is the split kind's companion rule (plan.h), and how many
 * logical features one stored element covers comes from the quantized companions table below
 * (FP8 block scales, NVFP4 group scales), or else from the ratio of L to the stored length (a
 * companion whose axis has 1 element is broadcast, kept whole). Scalars are replicated.
 */
#include "planner.h"
#include "slurp.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ======================= plan choice ======================= */

int tp_plan_builtin(const char *name, tp_plan *p, tp_err *e)
{
	int depth = 0;
	const char *want = name;
	tp_plan cur;
	memset(p, 0, sizeof *p);
	/* load the chain top-down, then fold each base into the plan above it */
	tp_plan chain[5];
	int n = 0;
	while (want) {
		int i = tp_builtin_find(want);
		if (i < 0 || depth == 5) {
			for (int k = 0; k < n; k++)
				tp_plan_free(&chain[k]);
			return tp_fail(e, TP_EINVAL, "plan '%s' extends '%s', which is not a built-in plan", name, want);
		}
		size_t len;
		const char *text = tp_builtin_text(i, &len);
		char origin[128];
		tp_fmt(origin, sizeof origin, "built-in plan %s", want);
		if (tp_plan_parse(text, len, origin, &cur, e) < 0) {
			for (int k = 0; k < n; k++)
				tp_plan_free(&chain[k]);
			return -1;
		}
		chain[n++] = cur;
		want = cur.extends;
		depth++;
	}
	for (int k = n - 1; k > 0; k--)
		if (tp_plan_extend(&chain[k - 1], &chain[k], e) < 0) {
			for (int j = 0; j < k; j++)
				tp_plan_free(&chain[j]);
			return -1;
		}
	*p = chain[0];
	return 0;
}

/* Does the string value v appear in the list l? */
static int listed(const cJSON *l, const cJSON *v)
{
	const cJSON *it;
	if (!cJSON_IsString(v))
		return 0;
	cJSON_ArrayForEach(it, l) if (cJSON_IsString(it) && strcmp(it->valuestring, v->valuestring) == 0) return 1;
	return 0;
}

/* Does plan detection det know cfg's model_type (by_arch 0) or one of its architectures (1)? */
static int detect_one(const cJSON *det, const cJSON *cfg, int by_arch)
{
	if (!cJSON_IsObject(cfg))
		return 0;
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(det, "model_type");
	const cJSON *ar = cJSON_GetObjectItemCaseSensitive(det, "architectures");
	if (!by_arch)
		return listed(mt, cJSON_GetObjectItemCaseSensitive(cfg, "model_type"));
	const cJSON *a;
	cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(cfg, "architectures")) if (listed(ar, a)) return 1;
	return 0;
}

int tp_builtin_detect(const cJSON *config)
{
	if (!config)
		return -1;
	/* the top level before text_config, and at each a model_type any plan knows before the
	 * architectures (a plan listing an architecture must not win over the plan of the model_type) */
	for (int pass = 0; pass < 4; pass++) {
		const cJSON *cfg = pass / 2 ? cJSON_GetObjectItemCaseSensitive(config, "text_config") : config;
		for (int i = 0; i < tp_builtin_count(); i++) {
			size_t len;
			const char *text = tp_builtin_text(i, &len);
			cJSON *p = cJSON_ParseWithLength(text, len);
			int hit = p && detect_one(cJSON_GetObjectItemCaseSensitive(p, "detect"), cfg, pass % 2);
			cJSON_Delete(p);
			if (hit)
				return i;
		}
	}
	return -1;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

/* The built-in plans as "a, b, c", or with the model types each detects: "a (x, y); b; ...". */
static void builtin_list(char *list, size_t n, int with_types)
{
	list[0] = 0;
	for (int i = 0; i < tp_builtin_count(); i++) {
		size_t l = strlen(list);
		tp_fmt(list + l, n - l, "%s%s", i ? (with_types ? "; " : ", ") : "", tp_builtin_name(i));
		if (!with_types)
			continue;
		size_t len;
		const char *text = tp_builtin_text(i, &len);
		cJSON *p = cJSON_ParseWithLength(text, len);
		const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "detect"), "model_type"), *it;
		int k = 0;
		cJSON_ArrayForEach(it, mt)
		{
			if (!cJSON_IsString(it))
				continue;
			l = strlen(list);
			tp_fmt(list + l, n - l, "%s%s", k++ ? ", " : " (", it->valuestring);
		}
		l = strlen(list);
		tp_fmt(list + l, n - l, "%s", k ? ")" : " (only with --plan generic)");
		cJSON_Delete(p);
	}
}

/* The refusal of a checkpoint whose architecture no built-in plan knows. */
static int refuse_unknown(const cJSON *config, tp_err *e)
{
	char arch[256] = "", list[TP_ERR_MSG / 2];
	const cJSON *mt = config ? cJSON_GetObjectItemCaseSensitive(config, "model_type") : NULL;
	const cJSON *tc = config ? cJSON_GetObjectItemCaseSensitive(config, "text_config") : NULL;
	const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
	if (cJSON_IsString(mt))
		tp_fmt(arch, sizeof arch, "model_type '%.80s'%s%.80s%s", mt->valuestring, cJSON_IsString(tmt) ? " (text_config: '" : "",
		       cJSON_IsString(tmt) ? tmt->valuestring : "", cJSON_IsString(tmt) ? "')" : "");
	else if (cJSON_IsString(tmt))
		tp_fmt(arch, sizeof arch, "text_config.model_type '%.80s'", tmt->valuestring);
	else
		tp_fmt(arch, sizeof arch, "%s", config ? "a config.json without model_type" : "a checkpoint without config.json");
	builtin_list(list, sizeof list, 0); /* the model types of every plan no longer fit in one message */
	return tp_fail(e, TP_EINVAL,
		       "no built-in plan knows %s (built-in plans: %s; 'tpfs plan --list' shows the model types each "
		       "detects, docs/COVERAGE.md the families served and refused); give a plan file with --plan FILE (docs/PLANS.md), "
		       "or, after checking what it does with 'tpfs plan SRC --tp N --plan generic', accept the generic "
		       "name-based guess with --plan generic",
		       arch, list);
}

int tp_plan_choose(const cJSON *config, const char *want, tp_plan *p, char *origin, size_t n, tp_err *e)
{
	int bi = -1;
	memset(p, 0, sizeof *p);
	if (!want) {
		bi = tp_builtin_detect(config);
		if (bi < 0)
			return refuse_unknown(config, e);
		tp_fmt(origin, n, "built-in %s (detected from config.json)", tp_builtin_name(bi));
	} else if (!strchr(want, '/') && !ends_with(want, ".json")) {
		bi = tp_builtin_find(want);
		if (bi < 0) {
			char list[512];
			builtin_list(list, sizeof list, 0);
			return tp_fail(e, TP_EINVAL, "--plan %s: no such built-in plan (built-in: %s; or give a plan file path)",
				       want, list);
		}
		tp_fmt(origin, n, "built-in %s (--plan)", want);
	}
	if (bi >= 0)
		return tp_plan_builtin(tp_builtin_name(bi), p, e);
	/* a user plan file */
	size_t len;
	char *text = tp_slurp(want, want, "(give a plan file)", &len, e);
	if (!text)
		return -1;
	int rc = tp_plan_parse(text, len, want, p, e);
	free(text);
	if (rc < 0)
		return -1;
	tp_fmt(origin, n, "%s", want);
	if (p->extends) {
		tp_plan base;
		if (tp_plan_builtin(p->extends, &base, e) < 0) {
			tp_err_prefix(e, "%s", want);
			tp_plan_free(p);
			return -1;
		}
		if (tp_plan_extend(p, &base, e) < 0) {
			tp_plan_free(p);
			return -1;
		}
		tp_fmt(origin, n, "%s (extends built-in %s)", want, p->extends);
	}
	return 0;
}

/* ======================= resolution ======================= */

/* Reference roles: the first of these a module has is its reference tensor (the one whose shape
 * fixes the split axis and the logical length); "" is a tensor named like the module itself (a
 * bare parameter such as A_log, or a fused experts tensor [E, ...] with role companions). A
 * tensor without a role is always its own reference. */
static const char *const reference_roles[] = {"weight", "weight_packed", "qweight", ""};

/* Packed formats: a reference weight holding several logical values per stored element along
 * its last axis, recognised by its dtype and a companion scale of a given dtype. */
static const struct packed_format {
	const char *what;
	st_dtype dtype[2];      /* the reference's stored dtype (either) */
	const char *scale_role; /* the companion that identifies the format */
	st_dtype scale_dtype;
	uint64_t per_element;   /* logical values per stored element */
} packed_formats[] = {
	{"NVFP4 (ModelOpt, compressed-tensors): two FP4 values per byte", {ST_U8, ST_I8}, "weight_scale", ST_F8_E4M3, 2},
};

/* Block and group sizes that config.json gives (0 when it gives none). */
static int64_t config_block(tp_expr_ctx *cfg, int last_axis);
static int64_t config_group(tp_expr_ctx *cfg, int last_axis);

#define NVFP4_GROUP 16 /* NVFP4's group size, when config.json gives none */

/* Along which cut axis a quantized companion's row applies. */
typedef enum quant_axis {
	QA_ANY,         /* whichever axis the split kind cuts */
	QA_PACKED_LAST, /* only the last axis, next to a packed reference (groups run along K) */
} quant_axis;

/* How a quantized companion relates its stored elements to logical features. */
typedef enum div_rule {
	DIV_BLOCK, /* one element per block (ceil for a partial last block); never a broadcast */
	DIV_GROUP, /* exactly one element per group */
} div_rule;

/* Quantized companions: a role (and dtype) whose divisor comes from the quantization config,
 * not from the ratio of the shapes. Any other companion is related to the reference by the
 * ratio of the shapes (equal: 1; one element: a broadcast, kept whole; a divisor: L / S).
 * Adding a quantized format is a row here (and, for a packed weight, a row in packed_formats). */
static const struct quant_companion {
	const char *role;
	int dtype;            /* st_dtype, or -1 for any */
	quant_axis axis;
	div_rule rule;
	int64_t (*size)(tp_expr_ctx *cfg, int last_axis); /* the block/group size config.json gives */
	int64_t default_size; /* when it gives none (0: fall back to the shapes' ratio) */
	const char *config_key; /* for messages */
} quant_companions[] = {
	/* FP8 block scales (DeepSeek-V3): one per 128 x 128 block, ceil for a partial last block */
	{"weight_scale_inv", -1, QA_ANY, DIV_BLOCK, config_block, 0, "quantization_config.weight_block_size"},
	/* NVFP4 group scales (ModelOpt, compressed-tensors): one F8 scale per group of 16 along K */
	{"weight_scale", ST_F8_E4M3, QA_PACKED_LAST, DIV_GROUP, config_group, NVFP4_GROUP, "quantization_config group_size"},
};

/* The block size the config gives for an axis of a block-quantized weight (FP8
 * weight_block_size [n, k]); 0 if none. */
static int64_t config_block(tp_expr_ctx *cfg, int last_axis)
{
	const cJSON *q = tp_config_get(cfg, "quantization_config.weight_block_size");
	if (!cJSON_IsArray(q) || cJSON_GetArraySize(q) != 2)
		return 0;
	const cJSON *v = cJSON_GetArrayItem(q, last_axis ? 1 : 0);
	return cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 4294967296.0 ? (int64_t)v->valuedouble : 0;
}

/* The group size the config gives (quantization_config.group_size, or the weights of the first
 * compressed-tensors config group); 0 if none. */
static int64_t config_group(tp_expr_ctx *cfg, int last_axis)
{
	(void)last_axis;
	const cJSON *q = tp_config_get(cfg, "quantization_config.group_size");
	if (cJSON_IsNumber(q) && q->valuedouble >= 1 && q->valuedouble <= 4294967296.0)
		return (int64_t)q->valuedouble;
	const cJSON *groups = tp_config_get(cfg, "quantization_config.config_groups"), *g;
	cJSON_ArrayForEach(g, groups)
	{
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g, "weights"), "group_size");
		if (cJSON_IsNumber(w) && w->valuedouble >= 1 && w->valuedouble <= 4294967296.0)
			return (int64_t)w->valuedouble;
	}
	return 0;
}

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

/* Stage 1, match: the first rule whose pattern covers the name and whose `when` holds.
 * Returns 1 (a rule), 0 (none), or -1 (a `when` that cannot be evaluated). */
static int stage_match(job *j, tp_resolved *out)
{
	const tp_plan *pl = j->pl;
	for (int i = 0; i < pl->nrules; i++) {
		for (int k = 0; k < pl->rules[i].npat; k++) {
			j->cfg->nvar = 0;
			tp_expr_bind(j->cfg, "T", j->o->T);
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

/* Stage 2, reference: the module, the tensor's role in it, the reference tensor and its
 * packing. */
static void stage_reference(job *j)
{
	const st_tensor *t = j->t;
	tp_fmt(j->module, sizeof j->module, "%.*s", j->plen, t->name);
	j->role = t->name[j->plen] == '.' ? t->name + j->plen + 1 : "";
	j->ref = t;
	if (*j->role) {
		for (size_t i = 0; i < sizeof reference_roles / sizeof reference_roles[0]; i++) {
			char nm[ST_MAX_NAME + 32];
			tp_fmt(nm, sizeof nm, "%s%s%s", j->module, *reference_roles[i] ? "." : "", reference_roles[i]);
			const st_tensor *c = j->lookup(j->lctx, nm);
			if (c) {
				j->ref = c;
				break;
			}
		}
	}
	j->packed = 1;
	const st_tensor *ref = j->ref;
	for (size_t i = 0; i < sizeof packed_formats / sizeof packed_formats[0] && ref->ndim >= 1; i++) {
		const struct packed_format *f = &packed_formats[i];
		if (ref->dtype != f->dtype[0] && ref->dtype != f->dtype[1])
			continue;
		char nm[ST_MAX_NAME + 32];
		tp_fmt(nm, sizeof nm, "%s.%s", j->module, f->scale_role);
		const st_tensor *s = j->lookup(j->lctx, nm);
		if (s && s->dtype == f->scale_dtype && s->ndim == ref->ndim) {
			j->packed = f->per_element;
			break;
		}
	}
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

/* Stage 5a: which axis of this tensor is cut (the split kind's companion rule). Returns 1 when
 * the tensor stays whole (with why filled in), 0 with j->axis set, or -1. */
static int companion_axis(job *j, tp_resolved *out)
{
	const tp_rule *r = j->r;
	const st_tensor *t = j->t, *ref = j->ref;
	j->axis = j->axis_ref;
	if (t == ref)
		return 0;
	int vec = t->ndim < 2;
	int whole = 0;
	switch (j->kind->lower) {
	case TK_LO_SPLIT:
		break;
	case TK_LO_VEC_WHOLE:
		whole = vec;
		break;
	case TK_LO_VEC_FEWER:
		whole = vec && t->ndim != ref->ndim;
		break;
	case TK_LO_FEWER_WHOLE:
		whole = t->ndim < ref->ndim;
		break;
	}
	if (whole && !(vec && r->bias == 1)) {
		tp_fmt(out->why, sizeof out->why, "replicate (%s companion of a %s split)", vec ? "1-D" : "lower-rank",
		       j->kind->comp == TK_CA_LAST ? "row-parallel" : "non-column");
		return 1;
	}
	switch (j->kind->comp) {
	case TK_CA_FIRST:
		j->axis = 0;
		break;
	case TK_CA_LAST:
		j->axis = (int)t->ndim - 1;
		break;
	case TK_CA_SAME:
		j->axis = j->axis_ref;
		break;
	case TK_CA_FROM_END:
		j->axis = (int)t->ndim - ((int)ref->ndim - j->axis_ref);
		break;
	case TK_CA_NONE:
		return tp_fail(j->e, TP_ERULE, "%s: plan '%s', rule '%s': split kind '%s' cuts no companion", j->tctx,
			       j->pl->name, r->name, j->kind->name);
	}
	if (j->axis < 0 || j->axis >= (int)t->ndim)
		return tp_fail(j->e, TP_EPLAN, "%s (rule '%s'): has %u dimensions, its module's weight %u", j->tctx, r->name,
			       t->ndim, ref->ndim);
	if (r->bias == 0 && t->ndim == 1) {
		tp_fmt(out->why, sizeof out->why, "replicate (bias kept whole by the rule)");
		return 1;
	}
	return 0;
}

/* Stage 5b: how many logical features one stored element of this tensor covers along the cut
 * axis. Returns 1 when the tensor is a broadcast (kept whole), 0 with j->div set, or -1. */
static int companion_divisor(job *j, tp_resolved *out)
{
	const tp_rule *r = j->r;
	const st_tensor *t = j->t;
	const char *tctx = j->tctx;
	tp_err *e = j->e;
	uint64_t S = t->shape[j->axis], L = j->L;
	int last = j->axis == (int)t->ndim - 1 && t->ndim > 1;
	if (r->div) {
		j->div = (uint64_t)r->div;
		return 0;
	}
	if (t == j->ref) {
		j->div = j->packed;
		return 0;
	}
	for (size_t i = 0; i < sizeof quant_companions / sizeof quant_companions[0]; i++) {
		const struct quant_companion *q = &quant_companions[i];
		if (strcmp(j->role, q->role) || (q->dtype >= 0 && (int)t->dtype != q->dtype) ||
		    (q->axis == QA_PACKED_LAST && (j->packed == 1 || !last)))
			continue;
		int64_t b = q->size(j->cfg, last);
		if (b <= 0)
			b = q->default_size;
		if (q->rule == DIV_BLOCK) {
			if (b > 0 && S != (L + (uint64_t)b - 1) / (uint64_t)b)
				return tp_fail(e, TP_EPLAN,
					       "%s (rule '%s'): axis %d has %llu blocks but ceil(%llu / %lld) = %llu (%s)",
					       tctx, r->name, j->axis, (unsigned long long)S, (unsigned long long)L, (long long)b,
					       (unsigned long long)((L + (uint64_t)b - 1) / (uint64_t)b), q->config_key);
			if (b > 0)
				j->div = (uint64_t)b;
			else if (S && L % S == 0)
				j->div = L / S;
			else
				return tp_fail(e, TP_EPLAN,
					       "%s (rule '%s'): axis %d has %llu blocks for %llu features and config.json gives no %s",
					       tctx, r->name, j->axis, (unsigned long long)S, (unsigned long long)L, q->config_key);
			return 0;
		}
		/* DIV_GROUP */
		if (S * (uint64_t)b != L)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d has %llu group scales but %llu features in groups of %lld need %llu",
				       tctx, r->name, j->axis, (unsigned long long)S, (unsigned long long)L, (long long)b,
				       (unsigned long long)(L / (uint64_t)b));
		j->div = (uint64_t)b;
		return 0;
	}
	/* any other companion: by the ratio of the shapes */
	if (S == L) {
		j->div = 1;
	} else if (S == 1) {
		tp_fmt(out->why, sizeof out->why, "replicate (broadcast along the split axis)");
		return 1;
	} else if (S && L % S == 0) {
		j->div = L / S;
	} else {
		int64_t b = config_block(j->cfg, last);
		if (b > 0 && (L + (uint64_t)b - 1) / (uint64_t)b == S)
			j->div = (uint64_t)b;
		else
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d has %llu elements, which do not relate to the %llu features of '%s' "
				       "(neither equal, a divisor, nor ceil(%llu / block) for the config's block size)",
				       tctx, r->name, j->axis, (unsigned long long)S, (unsigned long long)L, j->ref->name,
				       (unsigned long long)L);
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
				out->spec.flags = TP_EXPERT;
				tp_fmt(out->why, sizeof out->why, "expert %lld of %lld, whole on its rank (--ep)", (long long)ei,
				       (long long)E);
				return 1;
			}
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
			out->spec.flags = TP_EXPERT;
			out->logical = (uint64_t)E;
			tp_fmt(out->why, sizeof out->why, "experts axis %d, %lld experts, whole ones per rank (--ep)", a,
			       (long long)E);
			return 1;
		}
	}
	return 0;
}

int tp_plan_ep_check(const tp_plan *pl, tp_expr_ctx *cfg, uint32_t T, int64_t *E, tp_err *e)
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
		stage_reference(j);
		rc = stage_geometry(j);
		if (rc == 0)
			rc = stage_distribution(j);
		if (rc == 0)
			rc = companion_axis(j, out);
		if (rc == 0)
			rc = companion_divisor(j, out);
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
