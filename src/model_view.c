/* model_view.c: an engine view over a planned model (--view; see view.h and model.h).
 *
 * The plan says which bytes a rank owns; the view says how they are named and packed. The view
 * is chosen once the plan is (it names the plans it applies to) and before any tensor is
 * planned, since it decides the vocabulary padding (vLLM pads to a multiple of 64 before it
 * divides). Once every source file is planned (each keeping its specs), the view is resolved
 * over the source files a loader would read and every rank's part files are built (served.c).
 */
#include "model.h"
#include "model_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurp.h"

void tp_model_view_name(uint32_t r, size_t p, char *out, size_t cap)
{
	snprintf(out, cap, "model-rank-%u-part-%zu.safetensors", r, p);
}

int tp_model_view_choose(tp_model *m, tp_err *e)
{
	const tp_model_opts *o = m->o;
	m->pad_vocab = o->pad_vocab;
	if (!o->view)
		return 0;
	if (o->ep)
		return tp_fail(e, TP_EINVAL, "--view %s with --ep: not proven (vLLM places experts itself); mount without "
			       "--ep", o->view);
	/* a quantized checkpoint: served only by a view that lists its quant_method (the view proves
	 * what the engine holds before its post-load processing, companions included) */
	const cJSON *qc = cJSON_GetObjectItemCaseSensitive(m->config, "quantization_config");
	const cJSON *qmj = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
	if (qc && !cJSON_IsString(qmj))
		return tp_fail(e, TP_EINVAL, "--view %s: config.json's quantization_config has no quant_method string: "
			       "which quantization the engine applies is not known, so no view can be chosen; the hf view "
			       "(rank folders) serves it", o->view);
	const char *quant = qc ? qmj->valuestring : NULL;
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config, "model_type");
	const char *model_type = cJSON_IsString(mt) ? mt->valuestring : NULL;
	int is_file = strchr(o->view, '/') || (strlen(o->view) > 5 && !strcmp(o->view + strlen(o->view) - 5, ".json"));
	char *text = NULL;
	size_t len = 0;
	if (is_file && !(text = tp_slurp(o->view, o->view, NULL, &len, e)))
		return -1;
	m->view = calloc(1, sizeof *m->view);
	int rc = m->view ? tp_view_choose(o->view, text, len, m->plan.name, model_type, quant, m->view, e)
			 : tp_fail(e, TP_ENOMEM, "out of memory");
	free(text);
	if (rc < 0) {
		free(m->view);
		m->view = NULL;
		return -1;
	}
	if (m->view->pad_vocab) {
		if (o->pad_vocab && o->pad_vocab != m->view->pad_vocab) {
			unsigned long long want = m->view->pad_vocab;
			tp_model_view_free(m);
			return tp_fail(e, TP_EINVAL, "--pad-vocab=%llu: the %s view pads the vocabulary to a multiple of "
				       "%llu (as the engine does); leave --pad-vocab out", (unsigned long long)o->pad_vocab,
				       o->view, want);
		}
		m->pad_vocab = m->view->pad_vocab;
	}
	tp_model_log(m, 1, "view: %s (%s)", m->view->origin, m->view->proven ? m->view->proven : "not proven");
	return 0;
}

/* Evaluates a condition of the view (an entry's "when" / "unless", a "refuse" entry's "if") in c
 * (config.json with the plan's prefixes, the view's defaults, T): 0 or 1, or -1 with e set, also
 * where it reads a key that neither config.json nor the view's "defaults" has outside has() and
 * first() (such a condition could never be what its writer meant). what names the entry. */
static int view_cond(const tp_model *m, tp_expr_ctx *c, const char *cond, const char *what, tp_err *e)
{
	tp_err pe;
	tp_err_clear(&pe);
	int hit = tp_expr_cond(c, cond, &pe);
	if (hit < 0)
		return tp_fail(e, TP_EPLAN, "%s: %s: %s", m->view->origin, what, pe.msg);
	if (c->missing[0])
		return tp_fail(e, TP_EPLAN, "%s: %s: '%s' reads config key '%s', which config.json does not have and the view "
			       "gives no default for (a \"defaults\" entry states the config class's value; has() tests "
			       "for the key)", m->view->origin, what, cond, c->missing);
	return hit;
}

/* Whether node f is among the files a loader of the view reads: those the root index lists
 * (when there is one), else the safetensors files at the root. */
static int read_by_loader(const tp_model *m, const cJSON *root_index, uint32_t f)
{
	if (!root_index)
		return m->n[f].parent == 0;
	const cJSON *it, *wm = cJSON_GetObjectItemCaseSensitive(root_index, "weight_map");
	cJSON_ArrayForEach(it, wm)
	{
		if (cJSON_IsString(it) && tp_node_resolve(m, 0, it->valuestring) == f)
			return 1;
	}
	return 0;
}

int tp_model_view_build(tp_model *m, const cJSON *root_index, tp_err *e)
{
	if (!m->view)
		return 0;
	tp_vsource *src = calloc(m->ntensor_files ? m->ntensor_files : 1, sizeof *src);
	m->vsrc_node = calloc(m->ntensor_files ? m->ntensor_files : 1, sizeof *m->vsrc_node);
	if (!src || !m->vsrc_node) {
		free(src);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	uint32_t ns = 0;
	for (uint32_t i = 0; i < m->nn; i++) {
		const tp_node *n = &m->n[i];
		if (n->kind != TN_TENSORS || !n->specs || ns == m->ntensor_files || !read_by_loader(m, root_index, i))
			continue;
		src[ns] = (tp_vsource){n->path, &n->h, n->specs};
		m->vsrc_node[ns++] = i;
	}
	tp_expr_ctx c = m->cfg; /* the one lookup order: the plan's prefixes, the top, the view's defaults */
	c.defaults = m->view->defaults;
	tp_expr_bind(&c, "T", m->T);
	int rc = 0;
	for (size_t k = 0; rc == 0 && k < m->view->ne; k++) { /* "when": the entries this config.json leaves out */
		tp_ventry *x = &m->view->e[k];
		if (!x->when)
			continue;
		char what[160];
		snprintf(what, sizeof what, "tensors[%zu] (%s) \"%s\"", k, x->name ? x->name : x->per ? x->per : "",
			 x->negate ? "unless" : "when");
		int hit = view_cond(m, &c, x->when, what, e);
		if (hit < 0)
			rc = -1;
		x->off = x->negate ? hit == 1 : hit == 0;
	}
	if (rc == 0 && m->view->drop_key) { /* "drop_layers": the first layer index left out, from config.json */
		const cJSON *x = tp_config_get(&c, m->view->drop_key);
		if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= 1e15)
			rc = tp_fail(e, TP_EINVAL, "%s: config.json has no count '%s' (the layers it builds)", m->view->origin,
				     m->view->drop_key);
		else
			m->view->drop_from = (uint64_t)x->valuedouble;
	}
	const cJSON *it;
	size_t k = 0;
	cJSON_ArrayForEach(it, m->view->refuse) /* "refuse": layouts the engine holds otherwise */
	{
		const char *cond = cJSON_GetObjectItemCaseSensitive(it, "if")->valuestring;
		char what[32];
		snprintf(what, sizeof what, "refuse[%zu] \"if\"", k++);
		int hit = rc < 0 ? 0 : view_cond(m, &c, cond, what, e);
		if (hit < 0)
			rc = -1;
		else if (hit)
			rc = tp_fail(e, TP_EPLAN, "%s refuses this checkpoint at T=%u: %s (%s; %s)", m->view->origin, m->T,
				     cJSON_GetObjectItemCaseSensitive(it, "reason")->valuestring, cond, tp_expr_used(&c));
		if (rc < 0)
			break;
	}
	if (rc < 0) {
		free(src);
		return -1;
	}
	rc = tp_view_resolve(m->view, src, ns, &m->vplan, e);
	free(src);
	if (rc < 0)
		return -1;
	size_t np = m->vplan.nparts;
	m->vs = calloc((size_t)m->T * (np ? np : 1), sizeof *m->vs);
	m->vnode = calloc(np ? np : 1, sizeof *m->vnode);
	if (!m->vs || !m->vnode)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (size_t p = 0; p < np; p++) {
		const tp_vpart *pt = &m->vplan.parts[p];
		if (!(m->vnode[p] = malloc((pt->nsrc ? pt->nsrc : 1) * sizeof **m->vnode)))
			return tp_fail(e, TP_ENOMEM, "out of memory");
		for (uint32_t k = 0; k < pt->nsrc; k++)
			m->vnode[p][k] = m->vsrc_node[pt->srcs[k]];
	}
	for (uint32_t r = 0; r < m->T; r++) {
		for (size_t p = 0; p < np; p++) {
			const tp_vpart *pt = &m->vplan.parts[p];
			const st_header *hs[64], **h = pt->nsrc <= 64 ? hs : malloc(pt->nsrc * sizeof *h);
			if (!h)
				return tp_fail(e, TP_ENOMEM, "out of memory");
			for (uint32_t k = 0; k < pt->nsrc; k++)
				h[k] = &m->n[m->vnode[p][k]].h;
			const tp_node *own = &m->n[m->vsrc_node[pt->file]];
			char fname[96];
			tp_model_view_name(r, p, fname, sizeof fname);
			rc = tp_served_build(h, pt->nsrc, pt->d, pt->n, own->h.meta, own->h.nmeta, m->rf.rank_meta + 3 * (size_t)r,
					     3, m->T, r, fname, &m->vs[r * np + p], e);
			if (h != hs)
				free(h);
			if (rc < 0)
				return -1;
		}
	}
	tp_model_log(m, 1, "view %s: %llu tensors per rank in %zu parts (%llu fused or stacked, %llu constants)",
		     m->view->name, (unsigned long long)m->vplan.ntensors, np, (unsigned long long)m->vplan.nfused,
		     (unsigned long long)m->vplan.nconsts);
	return 0;
}

void tp_model_view_free(tp_model *m)
{
	if (m->vs)
		for (size_t k = 0; k < (size_t)m->T * m->vplan.nparts; k++)
			tp_served_free(&m->vs[k]);
	free(m->vs);
	m->vs = NULL;
	for (size_t p = 0; m->vnode && p < m->vplan.nparts; p++)
		free(m->vnode[p]);
	free(m->vnode);
	m->vnode = NULL;
	tp_vplan_free(&m->vplan);
	free(m->vsrc_node);
	m->vsrc_node = NULL;
	if (m->view)
		tp_view_free(m->view);
	free(m->view);
	m->view = NULL;
}
