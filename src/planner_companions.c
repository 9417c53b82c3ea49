/* planner_companions.c: the module around a tensor, for resolution (planner_stages.h): which
 * tensor of the module is its reference (stage 2: weight, weight_packed, qweight, or the tensor
 * itself) and whether that reference is packed (two FP4 values per byte), then, for every other
 * tensor of the module (a companion: bias, scales), which of its axes is cut (stage 5a, the
 * split kind's companion rule) and how many logical features one stored element covers
 * (stage 5b). The quantized formats are tables here: a packed format is a row of
 * packed_formats, a quantized companion (FP8 block scales, NVFP4 group scales) a row of
 * quant_companions; any other companion is related to its reference by the ratio of the shapes
 * (a companion whose axis has 1 element is broadcast, kept whole).
 */
#include "planner_stages.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

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

/* Stage 2, reference: the module, the tensor's role in it, the reference tensor and its
 * packing. */
void tp_stage_reference(job *j)
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

/* Stage 5a: which axis of this tensor is cut (the split kind's companion rule). Returns 1 when
 * the tensor stays whole (with why filled in), 0 with j->axis set, or -1. */
int tp_stage_companion_axis(job *j, tp_resolved *out)
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
int tp_stage_companion_divisor(job *j, tp_resolved *out)
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
	/* any other companion: by the ratio of the shapes, which only a quantized checkpoint's companions
	 * (scales, zero points of formats the table has no row for) are known to follow: elsewhere a tensor
	 * whose axis merely divides the features (T5Gemma2's embed_tokens.eoi_embedding [hidden] beside a
	 * [vocab, hidden] weight) would be cut as if packed, so it is refused by name */
	if (S == L) {
		j->div = 1;
	} else if (S == 1) {
		tp_fmt(out->why, sizeof out->why, "replicate (broadcast along the split axis)");
		return 1;
	} else if (!tp_config_get(j->cfg, "quantization_config")) {
		return tp_fail(e, TP_EPLAN,
			       "%s (rule '%s'): axis %d has %llu elements against the %llu features of '%s', and the checkpoint "
			       "is not quantized (config.json has no quantization_config), so it is no quantization companion "
			       "whose elements each cover %llu features: a rule must say how to cut it (or keep it whole)",
			       tctx, r->name, j->axis, (unsigned long long)S, (unsigned long long)L, j->ref->name,
			       (unsigned long long)(S ? L / S : 0));
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
