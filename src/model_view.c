/* model_view.c: an engine view over a planned source tree (--view; see model_view.h and view.h).
 *
 * The view is chosen once the plan is (it names the plans it applies to) and before any tensor is
 * planned, since it decides the vocabulary padding (vLLM pads to a multiple of 64 before it
 * divides). Once every source file is planned (each keeping its specs), the view is resolved over
 * the source files a loader would read and every rank's part files are built (served.c). Both
 * steps are told what they read and return what they make: this room knows no model.
 */
#include "model_view.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurp.h"

void tp_mview_name(uint32_t T, uint32_t P, uint32_t D, uint32_t g, size_t k, char *out, size_t cap)
{
	if (P > 1)
		snprintf(out, cap, "model-pp-%u-tp-%u-part-%zu.safetensors", g / T, g % T, k);
	else if (D > 1)
		snprintf(out, cap, "model-dp-%u-rank-%u-part-%zu.safetensors", g / T, g % T, k);
	else
		snprintf(out, cap, "model-rank-%u-part-%zu.safetensors", g, k);
}

int tp_mview_slot(const tp_mview *v, uint32_t g, size_t k)
{
	return v->stage_np && g < v->W && k < v->stage_np[g / v->T];
}

int tp_mview_file(const tp_mview *v, uint32_t g, size_t k, tp_view_file *f)
{
	if (!tp_mview_slot(v, g, k))
		return 0;
	const size_t np = v->vplan.nparts, p = v->slot_part[(size_t)(g / v->T) * np + k];
	const tp_vpart *pt = &v->vplan.parts[p];
	*f = (tp_view_file){.layout = &v->vs[(size_t)g * np + k], .vpart = pt, .part = p, .nsrc = pt->nsrc,
			    .nodes = v->node[p], .own = v->src_node[pt->file]};
	return 1;
}

/* l[0 .. n) joined by ", " into buf, or `none` where n is 0; returns buf. */
static const char *joined(const char *const *l, uint32_t n, const char *none, char *buf, size_t cap)
{
	size_t w = 0;
	buf[0] = 0;
	for (uint32_t k = 0; k < n && w < cap; k++)
		w += (size_t)snprintf(buf + w, cap - w, "%s%s", k ? ", " : "", l[k]);
	return n ? buf : none;
}

/* Frees a view that tp_view_choose filled and *v. */
static void view_drop(tp_view **v)
{
	if (*v)
		tp_view_free(*v);
	free(*v);
	*v = NULL;
}

int tp_mview_choose(const tp_mview_choice *in, tp_plan *plan, tp_view **view, uint64_t *pad_vocab, tp_err *e)
{
	*view = NULL;
	*pad_vocab = in->pad_vocab;
	if (!in->view)
		return in->P > 1 ? tp_fail(e, TP_EINVAL, "--pp %u: pipeline stages are served under an engine view only "
					   "(--view vllm: vLLM's model-pp-{s}-tp-{t} files); rank folders are per TP rank", in->P)
				 : 0;
	/* a quantized checkpoint: served only by a view that lists its quant_method (the view proves
	 * what the engine holds before its post-load processing, companions included) */
	const cJSON *qc = cJSON_GetObjectItemCaseSensitive(in->config, "quantization_config");
	const cJSON *qmj = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
	if (qc && !cJSON_IsString(qmj))
		return tp_fail(e, TP_EINVAL, "--view %s: config.json's quantization_config has no quant_method string: "
			       "which quantization the engine applies is not known, so no view can be chosen; the hf view "
			       "(rank folders) serves it", in->view);
	const char *quant = qc ? qmj->valuestring : NULL;
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(in->config, "model_type");
	const char *model_type = cJSON_IsString(mt) ? mt->valuestring : NULL;
	int is_file = strchr(in->view, '/') || (strlen(in->view) > 5 && !strcmp(in->view + strlen(in->view) - 5, ".json"));
	char *text = NULL;
	size_t len = 0;
	if (is_file && !(text = tp_slurp(in->view, in->view, NULL, &len, e)))
		return -1;
	tp_view *v = calloc(1, sizeof *v);
	int rc = v ? tp_view_choose(in->view, text, len, plan->name, model_type, quant, v, e)
		   : tp_fail(e, TP_ENOMEM, "out of memory");
	free(text);
	if (rc < 0) {
		free(v);
		return -1;
	}
	if (v->pad_vocab) {
		if (in->pad_vocab && in->pad_vocab != v->pad_vocab) {
			unsigned long long want = v->pad_vocab;
			view_drop(&v);
			return tp_fail(e, TP_EINVAL, "--pad-vocab=%llu: the %s view pads the vocabulary to a multiple of "
				       "%llu (as the engine does); leave --pad-vocab out", (unsigned long long)in->pad_vocab,
				       in->view, want);
		}
	}
	char types[512];
	if (in->D > 1 && !tp_view_listed(v->dp_ep_types, v->ndp_ep_types, model_type)) {
		tp_fail(e, TP_EINVAL, "--dp %u under %s: data parallelism with expert parallelism is proven for %s, not for "
			"model_type '%s' (vLLM places the experts over --dp x --tp ranks; the view must hold every other "
			"tensor as each DP rank's loader does); mount without --dp", in->D, v->origin,
			joined(v->dp_ep_types, v->ndp_ep_types, "no model type of this view", types, sizeof types),
			model_type ? model_type : "(none)");
		view_drop(&v);
		return -1;
	}
	const char *const *et = in->ep == 2 ? v->ep_rr_types : v->ep_types;
	uint32_t net = in->ep == 2 ? v->nep_rr_types : v->nep_types;
	if (in->ep && !tp_view_listed(et, net, model_type)) {
		tp_fail(e, TP_EINVAL, "--ep%s under %s: expert parallelism%s is proven for %s, not for model_type '%s' (vLLM "
			"places the experts; the view must hold them as its loader does)%s; mount without --ep",
			in->ep == 2 ? "=round_robin" : "", v->origin, in->ep == 2 ? " with round_robin placement" : "",
			joined(et, net, "no model type of this view", types, sizeof types), model_type ? model_type : "(none)",
			in->ep == 2 ? " (vLLM places experts round-robin only in models with several expert groups, "
				      "else linearly: --ep)" : "");
		view_drop(&v);
		return -1;
	}
	if (in->P > 1 && (!v->pp_layers || !tp_view_listed(v->pp_types, v->npp_types, model_type))) {
		/* stages: the view must place every tensor, for this model type */
		tp_fail(e, TP_EINVAL, "--pp %u: %s has %s: pipeline stages are proven for %s, not for model_type '%s'; "
			"mount without --pp", in->P, v->origin, v->pp_layers ? "stages" : "no pipeline stages",
			joined(v->pp_types, v->pp_layers ? v->npp_types : 0, "no model type under it", types, sizeof types),
			model_type ? model_type : "(none)");
		view_drop(&v);
		return -1;
	}
	if (v->rules) { /* the engine's own cuts, before the plan's */
		tp_plan vp = {0};
		const char *desc = plan->description, *ext = plan->extends;
		if (tp_view_rules_plan(v->rules, plan->name, v->origin, &vp, e) < 0 || tp_plan_extend(&vp, plan, e) < 0) {
			tp_plan_free(&vp);
			view_drop(&v);
			return -1;
		}
		vp.description = desc; /* the plan's strings, now owned by vp (tp_plan_extend) */
		vp.extends = ext;
		*plan = vp;
	}
	if (v->pad_vocab)
		*pad_vocab = v->pad_vocab;
	tp_logf(in->log, in->log_ctx, 1, "view: %s (%s)", v->origin, v->proven ? v->proven : "not proven");
	*view = v;
	return 0;
}

/* Evaluates a condition of the view (an entry's "if" over config.json, a "refuse" entry's "if") in c
 * (config.json with the plan's prefixes, the view's defaults, T): 0 or 1, or -1 with e set, also
 * where it reads a key that neither config.json nor the view's "defaults" has outside has() and
 * first() (such a condition could never be what its writer meant). what names the entry. */
static int view_cond(const tp_view *v, tp_expr_ctx *c, const char *cond, const char *what, tp_err *e)
{
	tp_err pe;
	tp_err_clear(&pe);
	int hit = tp_expr_cond(c, cond, &pe);
	if (hit < 0)
		return tp_fail(e, TP_EPLAN, "%s: %s: %s", v->origin, what, pe.msg);
	if (c->missing[0])
		return tp_fail(e, TP_EPLAN, "%s: %s: '%s' reads config key '%s', which config.json does not have and the view "
			       "gives no default for (a \"defaults\" entry states the config class's value; has() tests "
			       "for the key)", v->origin, what, cond, c->missing);
	return hit;
}

/* Marks in read[0 .. nn) the nodes a loader of the view reads: the files the root index lists
 * (when there is one), else the safetensors files at the root. One pass over the index (a
 * weight_map names each file once per tensor: consecutive repeats are resolved once). */
static void read_by_loader(const tp_srctree *t, const cJSON *root_index, uint8_t *read)
{
	if (!root_index) {
		for (uint32_t i = 0; i < t->nn; i++)
			read[i] = t->n[i].parent == 0;
		return;
	}
	const cJSON *it, *wm = cJSON_GetObjectItemCaseSensitive(root_index, "weight_map");
	const char *last = NULL;
	cJSON_ArrayForEach(it, wm)
	{
		if (!cJSON_IsString(it) || (last && !strcmp(last, it->valuestring)))
			continue;
		last = it->valuestring;
		uint32_t f = tp_node_resolve(t, 0, it->valuestring);
		if (f < t->nn)
			read[f] = 1;
	}
}

/* The amend step: view v's entries as config.json settles them (c: its lookup, with the view's
 * defaults and T bound): off[k] where entry k's "if" (not a per-match one: tp_view_resolve
 * evaluates those) is false, dil_rows[k][j] piece j's "deinterleave" rows (0: none); then the
 * view's "refuse" entries, one that holds refusing the checkpoint (T: for the message). Reads v
 * and changes nothing of it. Returns 0, or -1 with e set naming the view and the entry. */
static int settle(const tp_view *v, tp_expr_ctx *c, uint32_t T, uint8_t *off, uint64_t (*dil_rows)[8], tp_err *e)
{
	for (size_t k = 0; k < v->ne; k++) { /* "if": the entries this config.json leaves out */
		const tp_ventry *x = &v->e[k];
		if (!x->cond || x->per_match) /* tensor(): tp_view_resolve evaluates it for each match */
			continue;
		char what[160];
		snprintf(what, sizeof what, "tensors[%zu] (%s) \"if\"", k, x->name ? x->name : x->per ? x->per : "");
		int hit = view_cond(v, c, x->cond, what, e);
		if (hit < 0)
			return -1;
		off[k] = hit == 0;
	}
	for (size_t k = 0; k < v->ne; k++) { /* "deinterleave": each piece's block of rows */
		const tp_ventry *x = &v->e[k];
		for (uint32_t j = 0; j < 8; j++) {
			int64_t rows = 0;
			tp_err pe;
			tp_err_clear(&pe);
			if (!x->dil[j] || off[k])
				continue;
			if (tp_expr_int(c, x->dil[j], &rows, &pe) != 0 || c->missing[0] || rows < 2 || rows % 2 ||
			    rows > (1LL << 32))
				return tp_fail(e, TP_EPLAN, "%s: tensors[%zu] (%s) \"deinterleave\"[%u]: '%s' %s%s (%s)", v->origin,
					       k, x->name ? x->name : "", j, x->dil[j],
					       pe.msg[0] ? pe.msg : "is not an even number of rows, at least 2",
					       c->missing[0] ? ": config.json has no such key" : "", tp_expr_used(c));
			dil_rows[k][j] = (uint64_t)rows;
		}
	}
	const cJSON *it;
	size_t k = 0;
	cJSON_ArrayForEach(it, v->refuse) /* "refuse": layouts the engine holds otherwise */
	{
		const char *cond = cJSON_GetObjectItemCaseSensitive(it, "if")->valuestring;
		char what[32];
		snprintf(what, sizeof what, "refuse[%zu] \"if\"", k++);
		int hit = view_cond(v, c, cond, what, e);
		if (hit < 0)
			return -1;
		if (hit)
			return tp_fail(e, TP_EPLAN, "%s refuses this checkpoint at T=%u: %s (%s; %s)", v->origin, T,
				       cJSON_GetObjectItemCaseSensitive(it, "reason")->valuestring, cond, tp_expr_used(c));
	}
	return 0;
}

static int build_stages(const tp_mview_in *in, tp_mview *m, tp_expr_ctx *c, tp_err *e);

int tp_mview_build(const tp_mview_in *in, tp_mview *m, tp_err *e)
{
	memset(m, 0, sizeof *m);
	m->T = in->T;
	m->P = in->P;
	m->D = in->D > 1 ? in->D : 1;
	m->G = m->P * m->D;
	m->W = m->G * in->T;
	const tp_view *v = in->view;
	const tp_srctree *t = in->tree;
	tp_vsource *src = calloc(in->ntensor_files ? in->ntensor_files : 1, sizeof *src);
	m->src_node = calloc(in->ntensor_files ? in->ntensor_files : 1, sizeof *m->src_node);
	uint8_t *read = calloc(t->nn ? t->nn : 1, 1);
	if (!src || !m->src_node || !read) {
		free(src);
		free(read);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	read_by_loader(t, in->root_index, read);
	uint32_t ns = 0;
	for (uint32_t i = 0; i < t->nn; i++) {
		const tp_node *n = &t->n[i];
		if (n->kind != TN_TENSORS || !n->specs || ns == in->ntensor_files || !read[i])
			continue;
		src[ns] = (tp_vsource){n->path, &n->h, n->specs};
		m->src_node[ns++] = i;
	}
	free(read);
	tp_expr_ctx c = *in->cfg; /* the one lookup order: the plan's prefixes, the top, the view's defaults */
	c.defaults = v->defaults;
	tp_expr_bind(&c, "T", in->T);
	tp_expr_bind(&c, "P", in->P);
	tp_expr_bind(&c, "EP", in->ep != 0);
	tp_expr_bind(&c, "EP_RR", in->ep == 2);
	tp_expr_bind(&c, "DP", m->D);
	uint8_t *off = calloc(v->ne ? v->ne : 1, sizeof *off);
	uint64_t(*dil_rows)[8] = calloc(v->ne ? v->ne : 1, sizeof *dil_rows);
	int rc = off && dil_rows ? settle(v, &c, in->T, off, dil_rows, e) : tp_fail(e, TP_ENOMEM, "out of memory");
	tp_vcfg vc = {.cond_ctx = &c, .off = off, .dil_rows = (const uint64_t(*)[8])dil_rows};
	if (rc == 0)
		rc = tp_view_resolve(v, &vc, src, ns, &m->vplan, e);
	free(off);
	free(dil_rows);
	free(src);
	if (rc < 0)
		return -1;
	size_t np = m->vplan.nparts;
	m->vs = calloc((size_t)m->W * (np ? np : 1), sizeof *m->vs);
	m->node = calloc(np ? np : 1, sizeof *m->node);
	m->stage_np = calloc(m->G, sizeof *m->stage_np);
	m->slot_part = calloc((size_t)m->G * (np ? np : 1), sizeof *m->slot_part);
	if (!m->vs || !m->node || !m->stage_np || !m->slot_part)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (size_t p = 0; p < np; p++) {
		const tp_vpart *pt = &m->vplan.parts[p];
		if (!(m->node[p] = malloc((pt->nsrc ? pt->nsrc : 1) * sizeof **m->node)))
			return tp_fail(e, TP_ENOMEM, "out of memory");
		for (uint32_t k = 0; k < pt->nsrc; k++)
			m->node[p][k] = m->src_node[pt->srcs[k]];
	}
	return build_stages(in, m, &c, e);
}

#define STAGE_EVERY 0xff /* build_stages: a tensor on every stage */

/* Whether served tensor d (of part pt), which the view's "pp" places on stage st, is made of
 * source tensors the same rules place on that stage (or do not place): a tensor served on one
 * stage from another's, such as lm_head.weight from model.embed_tokens.weight (tied
 * embeddings, which vLLM's Llama holds on both the first and the last stage), is refused rather
 * than served where the engine may hold it otherwise. Returns 0, or -1 with e set. */
static int same_stage(const tp_mview_in *in, const tp_mview *m, const tp_vpart *pt, const tp_sdesc *d, int st, tp_err *e)
{
	size_t p = (size_t)(pt - m->vplan.parts);
	for (uint32_t j = 0; j < d->npieces * (d->nstack ? d->nstack : 1); j++) {
		const tp_pdesc *pd = &d->pieces[j];
		const char *src = in->tree->n[m->node[p][pd->file]].h.t[pd->tensor].name;
		tp_err pe;
		tp_err_clear(&pe);
		int ps = tp_view_stage(in->view, src, m->P, m->pp_start, &pe);
		if (ps >= 0 && ps != st) {
			char a[24], b[24];
			snprintf(a, sizeof a, st == TP_PP_EVERY ? "every stage" : "stage %d", st);
			snprintf(b, sizeof b, ps == TP_PP_EVERY ? "every stage" : "stage %d", ps);
			return tp_fail(e, TP_EPLAN, "%s: --pp %u: tensor '%s' is served on %s but made of '%s', which the "
				       "view's \"pp\" places on %s (tied embeddings?): where the engine holds it is not "
				       "proven, so it is refused rather than guessed; mount without --pp",
				       in->view->origin, m->P, d->name, a, src, b);
		}
	}
	return 0;
}

/* Every view rank's part files: without stages, rank g's part k is vplan part k cut for g; with
 * stages (P > 1), the layers of each stage (tp_pp_partition over config.json's count) and the
 * stage of every served tensor (tp_view_stage) decide which tensors each stage's files hold, the
 * parts left empty for a stage being left out and the rest numbered from 0. c: config.json's
 * lookup. Returns 0, or -1 with e set. */
static int build_stages(const tp_mview_in *in, tp_mview *m, tp_expr_ctx *c, tp_err *e)
{
	size_t np = m->vplan.nparts, maxn = 1;
	for (size_t p = 0; p < np; p++)
		maxn = m->vplan.parts[p].n > maxn ? m->vplan.parts[p].n : maxn;
	uint8_t *stage = NULL;
	if (m->P > 1) {
		const cJSON *x = tp_config_get(c, in->view->pp_count);
		if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble >= 1e15 ||
		    x->valuedouble != (double)(uint64_t)x->valuedouble)
			return tp_fail(e, TP_EINVAL, "--pp %u: config.json has no layer count '%s' (%s divides the layers by it)",
				       m->P, in->view->pp_count, in->view->origin);
		if (tp_pp_partition((uint64_t)x->valuedouble, m->P, in->pp_layers, m->pp_start, e) < 0)
			return -1;
		if (!(stage = malloc(maxn)))
			return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	tp_sdesc *d = m->P > 1 ? malloc(maxn * sizeof *d) : NULL;
	if (m->P > 1 && !d) {
		free(stage);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	int rc = 0;
	for (size_t p = 0; rc == 0 && p < np; p++) {
		const tp_vpart *pt = &m->vplan.parts[p];
		for (size_t k = 0; rc == 0 && m->P > 1 && k < pt->n; k++) {
			int st = tp_view_stage(in->view, pt->d[k].name, m->P, m->pp_start, e);
			rc = st < 0 ? -1 : same_stage(in, m, pt, &pt->d[k], st, e);
			stage[k] = (uint8_t)(st == TP_PP_EVERY ? STAGE_EVERY : st < 0 ? 0 : st);
		}
		const st_header *hs[64], **h = pt->nsrc <= 64 ? hs : malloc(pt->nsrc * sizeof *h);
		if (!h && rc == 0)
			rc = tp_fail(e, TP_ENOMEM, "out of memory");
		for (uint32_t k = 0; rc == 0 && k < pt->nsrc; k++)
			h[k] = &in->tree->n[m->node[p][k]].h;
		const tp_node *own = &in->tree->n[m->src_node[pt->file]];
		for (uint32_t s = 0; rc == 0 && s < m->G; s++) { /* a stage, or a DP rank (holding every part) */
			const tp_sdesc *ds = pt->d;
			size_t nd = pt->n;
			if (m->P > 1) { /* the stage's tensors of this part, in order */
				nd = 0;
				for (size_t k = 0; k < pt->n; k++)
					if (stage[k] == s || stage[k] == STAGE_EVERY)
						d[nd++] = pt->d[k];
				ds = d;
				if (!nd)
					continue;
			}
			uint32_t slot = m->stage_np[s]++;
			m->slot_part[s * np + slot] = (uint32_t)p;
			for (uint32_t t = 0; rc == 0 && t < m->T; t++) {
				uint32_t g = s * m->T + t;
				char fname[96];
				tp_mview_name(m->T, m->P, m->D, g, slot, fname, sizeof fname);
				rc = tp_served_build_ep(h, pt->nsrc, ds, nd, own->h.meta, own->h.nmeta, in->rank_meta + 3 * (size_t)t,
							3, m->T, t, m->D > 1 ? m->W : 0, g, fname, &m->vs[(size_t)g * np + slot], e);
			}
		}
		if (h != hs)
			free(h);
	}
	free(d);
	free(stage);
	if (rc < 0)
		return -1;
	if (m->P > 1) {
		char lay[512];
		size_t w = 0;
		for (uint32_t s = 0; s < m->P && w < sizeof lay; s++)
			w += (size_t)snprintf(lay + w, sizeof lay - w, "%s%u: [%llu, %llu)", s ? ", " : "", s,
					      (unsigned long long)m->pp_start[s], (unsigned long long)m->pp_start[s + 1]);
		tp_logf(in->log, in->log_ctx, 1, "view %s: %u pipeline stages of %u ranks, layers %s", in->view->name, m->P, m->T, lay);
	}
	if (m->D > 1)
		tp_logf(in->log, in->log_ctx, 1, "view %s: %u data-parallel ranks of %u TP ranks, the routed experts over %u "
			"EP ranks (rank = DP rank x %u + TP rank)", in->view->name, m->D, m->T, m->W, m->T);
	tp_logf(in->log, in->log_ctx, 1, "view %s: %llu tensors per rank in %zu parts (%llu fused or stacked, %llu constants)",
		     in->view->name, (unsigned long long)m->vplan.ntensors, np, (unsigned long long)m->vplan.nfused,
		     (unsigned long long)m->vplan.nconsts);
	return 0;
}

void tp_mview_free(tp_mview *m)
{
	if (m->vs)
		for (size_t k = 0; k < (size_t)m->W * m->vplan.nparts; k++)
			tp_served_free(&m->vs[k]);
	free(m->vs);
	free(m->stage_np);
	free(m->slot_part);
	for (size_t p = 0; m->node && p < m->vplan.nparts; p++)
		free(m->node[p]);
	free(m->node);
	tp_vplan_free(&m->vplan);
	free(m->src_node);
	memset(m, 0, sizeof *m);
}
