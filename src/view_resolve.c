/* view_resolve.c: a parsed view and the planned source files turned into the served tensors of
 * every part (tp_view_resolve, see view.h): templates matched against the source tensors, the
 * source tensors the drop entries take left out first, the pieces of each served tensor found and
 * cut as the plan cuts them, constants made, the rest kept, and every served name checked to be
 * made once. */
#include "view.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"

/* ---- templates ---- */

typedef struct vbind {
	char var[TP_VIEW_VARS][32];
	const char *txt[TP_VIEW_VARS];
	size_t len[TP_VIEW_VARS];
	int n;
} vbind;

static int find_var(const vbind *b, const char *name, size_t nl)
{
	for (int k = 0; k < b->n; k++)
		if (strlen(b->var[k]) == nl && !strncmp(b->var[k], name, nl))
			return k;
	return -1;
}

/* Whether s matches template t; binds (or checks) its variables in b. A '*' ending t (a drop
 * template's: view.c allows it nowhere else) matches any rest of s. */
static int tmatch(const char *t, const char *s, vbind *b)
{
	while (*t) {
		if (t[0] == '*' && !t[1])
			return 1;
		if (*t != '{') {
			if (*t++ != *s++)
				return 0;
			continue;
		}
		const char *end = strchr(t, '}');
		size_t nl = (size_t)(end - t - 1);
		const char *d = s;
		while (*d >= '0' && *d <= '9')
			d++;
		if (d == s || nl >= sizeof b->var[0])
			return 0;
		int k = find_var(b, t + 1, nl);
		if (k >= 0) {
			if (b->len[k] != (size_t)(d - s) || strncmp(b->txt[k], s, b->len[k]))
				return 0;
		} else {
			if (b->n == TP_VIEW_VARS)
				return 0;
			k = b->n++;
			memcpy(b->var[k], t + 1, nl);
			b->var[k][nl] = 0;
			b->txt[k] = s;
			b->len[k] = (size_t)(d - s);
		}
		s = d;
		t = end + 1;
	}
	return *s == 0;
}

/* Template t with b's values in out[cap]; -1 when a variable is unbound or out is too small. */
static int expand(const char *t, const vbind *b, char *out, size_t cap)
{
	size_t w = 0;
	while (*t) {
		const char *p = t;
		size_t l;
		if (*t == '{') {
			const char *end = strchr(t, '}');
			int k = find_var(b, t + 1, (size_t)(end - t - 1));
			if (k < 0)
				return -1;
			p = b->txt[k];
			l = b->len[k];
			t = end + 1;
		} else {
			l = 1;
			t++;
		}
		if (w + l >= cap)
			return -1;
		memcpy(out + w, p, l);
		w += l;
	}
	out[w] = 0;
	return 0;
}

/* ---- resolution ---- */

typedef struct vname {
	const char *name;
	uint32_t f, t;
} vname;

typedef struct vres {
	const tp_view *v;
	const tp_vcfg *cfg;  /* never NULL here */
	const tp_vsource *src;
	uint32_t nsrc;
	vname *all;      /* every source tensor, sorted by name */
	size_t nall;
	uint8_t *used;   /* [nall] */
	tp_vplan *p;
	tp_vpart *byfile;/* [nsrc] while resolving */
	tp_err *e;
} vres;

static int cmp_vname(const void *a, const void *b)
{
	return strcmp(((const vname *)a)->name, ((const vname *)b)->name);
}

static long lookup(const vres *c, const char *name)
{
	size_t lo = 0, hi = c->nall;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int d = strcmp(name, c->all[mid].name);
		if (!d)
			return (long)mid;
		if (d < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

static int keep_block(vres *c, void *b)
{
	tp_vplan *p = c->p;
	if (!b)
		return tp_fail(c->e, TP_ENOMEM, "out of memory");
	if (p->nblocks == p->capblocks) {
		size_t cap = p->capblocks ? p->capblocks * 2 : 64;
		void **n = realloc(p->blocks, cap * sizeof *n);
		if (!n) {
			free(b);
			return tp_fail(c->e, TP_ENOMEM, "out of memory");
		}
		p->blocks = n;
		p->capblocks = cap;
	}
	p->blocks[p->nblocks++] = b;
	return 0;
}

static const char *keep_name(vres *c, const char *s)
{
	char *d = strdup(s);
	return d && keep_block(c, d) == 0 ? d : NULL;
}

/* Adds served tensor d (its pieces' files global) to the part of file f. */
static int add_desc(vres *c, uint32_t f, const tp_sdesc *d)
{
	tp_vpart *pt = &c->byfile[f];
	if (pt->n == pt->cap) {
		size_t cap = pt->cap ? pt->cap * 2 : 64;
		tp_sdesc *n = realloc(pt->d, cap * sizeof *n);
		if (!n)
			return tp_fail(c->e, TP_ENOMEM, "out of memory");
		pt->d = n;
		pt->cap = cap;
	}
	pt->d[pt->n++] = *d;
	c->p->ntensors++;
	return 0;
}

/* Pieces for templates tm[0..nt) under binding b into pd (global files); marks nothing yet.
 * Returns 1 (all found), 0 (one missing: *missing names it), -1 (error). */
static int find_pieces(vres *c, const char *const *tm, uint32_t nt, const vbind *b, tp_pdesc *pd, long *ix,
		       char *missing, size_t mcap)
{
	char name[ST_MAX_NAME + 1];
	for (uint32_t j = 0; j < nt; j++) {
		if (expand(tm[j], b, name, sizeof name) < 0)
			return tp_fail(c->e, TP_EINVAL, "%s: template '%s': a variable the first piece does not bind",
				       c->v->origin, tm[j]);
		long k = lookup(c, name);
		if (k < 0) {
			tp_fmt(missing, mcap, "%s", name);
			return 0;
		}
		if (c->used[k])
			return tp_fail(c->e, TP_EINVAL, "%s: source tensor '%s' is used by two entries of the view",
				       c->v->origin, name);
		ix[j] = k;
		pd[j].file = c->all[k].f;
		pd[j].tensor = c->all[k].t;
		pd[j].spec = c->src[c->all[k].f].specs[c->all[k].t];
	}
	return 1;
}

/* tensor('NAME') of a per-match condition: NAME filled in with the match's binding, then looked up
 * among the source tensors (a drop entry's condition: all of them; any other's: those the drop
 * entries leave). */
typedef struct mcond {
	vres *c;
	const vbind *b;
} mcond;

static int has_tensor(void *arg, const char *t)
{
	const mcond *m = arg;
	char name[ST_MAX_NAME + 1];
	if (expand(t, m->b, name, sizeof name) < 0)
		return -1;
	return lookup(m->c, name) >= 0;
}

/* Entry k's per-match "if" for binding b (its variables bound to their values, as integers): 1 (it
 * applies), 0 (not), -1 (e set: the expression fails, or reads a config key neither config.json
 * nor the view's defaults has). */
static int match_cond(vres *c, size_t k, const vbind *b)
{
	const tp_ventry *x = &c->v->e[k];
	tp_expr_ctx ctx = {0};
	if (c->cfg->cond_ctx)
		ctx = *c->cfg->cond_ctx;
	for (int j = 0; j < b->n; j++) {
		if (strlen(b->var[j]) > 15) /* one an "if" cannot read (view.c): not bound */
			continue;
		int64_t val = 0;
		for (size_t d = 0; d < b->len[j]; d++) /* digits; past int64, the largest */
			val = val > (INT64_MAX - 9) / 10 ? INT64_MAX : val * 10 + (b->txt[j][d] - '0');
		tp_expr_bind(&ctx, b->var[j], val);
	}
	mcond m = {c, b};
	ctx.tensor = has_tensor;
	ctx.tensor_arg = &m;
	tp_err pe;
	tp_err_clear(&pe);
	int hit = tp_expr_cond(&ctx, x->cond, &pe);
	if (hit < 0)
		return tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu] \"if\": %s", c->v->origin, k, pe.msg);
	if (ctx.missing[0])
		return tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu] \"if\": '%s' reads config key '%s', which config.json does "
			       "not have and the view gives no default for", c->v->origin, k, x->cond, ctx.missing);
	return hit;
}

typedef struct vmatch {
	char name[ST_MAX_NAME + 1]; /* the served name */
	uint64_t sval;              /* the stacked variable's value */
	vbind b;
	const char *key;            /* the matched source name (b's texts point into it) */
} vmatch;

static int cmp_vmatch(const void *a, const void *b)
{
	const vmatch *x = a, *y = b;
	int d = strcmp(x->name, y->name);
	return d ? d : (x->sval > y->sval) - (x->sval < y->sval);
}

static int resolve_cat(vres *c, size_t k)
{
	const tp_ventry *x = &c->v->e[k];
	vmatch *ms = NULL;
	size_t nm = 0, cap = 0;
	int rc = 0;
	for (size_t i = 0; i < c->nall && rc == 0; i++) {
		vbind b = {.n = 0};
		if (!tmatch(x->cat[0], c->all[i].name, &b))
			continue;
		if (nm == cap) {
			cap = cap ? cap * 2 : 64;
			vmatch *n = realloc(ms, cap * sizeof *n);
			if (!n) {
				rc = tp_fail(c->e, TP_ENOMEM, "out of memory");
				break;
			}
			ms = n;
		}
		vmatch *m = &ms[nm];
		m->b = b;
		m->key = c->all[i].name;
		m->sval = 0;
		if (x->stack) {
			int s = find_var(&b, x->stack, strlen(x->stack));
			m->sval = strtoull(b.txt[s], NULL, 10);
		}
		if (expand(x->name, &b, m->name, sizeof m->name) < 0) {
			rc = tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu]: served name '%s' uses a variable the first piece does "
				     "not bind", c->v->origin, k, x->name);
			break;
		}
		if (x->per_match) { /* "if" with tensor(): this match's */
			int hit = match_cond(c, k, &b);
			if (hit < 0) {
				rc = -1;
				break;
			}
			if (!hit)
				continue;
		}
		if (c->used[i]) {
			rc = tp_fail(c->e, TP_EINVAL, "%s: source tensor '%s' is used by two entries of the view (the second: "
				     "tensors[%zu])", c->v->origin, c->all[i].name, k);
			break;
		}
		nm++;
	}
	if (rc == 0 && nm) /* ms is NULL when nothing matched */
		qsort(ms, nm, sizeof *ms, cmp_vmatch);
	for (size_t g = 0; g < nm && rc == 0;) {
		size_t h = g;
		while (h < nm && !strcmp(ms[h].name, ms[g].name))
			h++;
		uint32_t groups = (uint32_t)(h - g);
		if (!x->stack && groups > 1) {
			rc = tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu]: served name '%s' is made %u times (its template binds "
				     "fewer variables than the pieces)", c->v->origin, k, ms[g].name, groups);
			break;
		}
		for (uint32_t s = 0; x->stack && s < groups; s++)
			if (ms[g + s].sval != s) {
				rc = tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu]: '%s' stacks over %s = 0..%u, but %s = %u is "
					     "missing", c->v->origin, k, ms[g].name, x->stack, groups - 1, x->stack, s);
				break;
			}
		size_t np = (size_t)groups * x->ncat;
		tp_pdesc *pd = rc == 0 ? malloc(np * sizeof *pd) : NULL;
		long *ix = rc == 0 ? malloc(np * sizeof *ix) : NULL;
		if (rc == 0 && (!pd || !ix)) {
			free(pd);
			rc = tp_fail(c->e, TP_ENOMEM, "out of memory");
		}
		int found = 1;
		char missing[ST_MAX_NAME + 1] = "";
		for (uint32_t s = 0; rc == 0 && found == 1 && s < groups; s++) {
			found = find_pieces(c, x->cat, x->ncat, &ms[g + s].b, pd + (size_t)s * x->ncat, ix + (size_t)s * x->ncat,
					    missing, sizeof missing);
			if (found < 0)
				rc = -1;
		}
		if (rc == 0 && found == 0)
			rc = tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu] ('%s'): source tensor '%s' is missing (the entry matched "
				     "'%s')", c->v->origin, k, ms[g].name, missing, ms[g].key);
		if (rc == 0 && found == 1) {
			for (size_t j = 0; j < np; j++) {
				c->used[ix[j]] = 1;
				pd[j].deint = c->cfg->dil_rows ? c->cfg->dil_rows[k][j % x->ncat] : 0; /* "deinterleave" */
			}
			tp_sdesc d = {.name = keep_name(c, ms[g].name), .pieces = pd, .npieces = x->ncat,
				      .nstack = x->stack ? groups : 0, .to_f32 = x->to_f32, .rs_ndim = x->rs_ndim,
				      .transpose = x->transpose, .rank0_only = x->rank0_only};
			memcpy(d.rs_shape, x->rs_shape, sizeof d.rs_shape);
			rc = keep_block(c, pd);
			pd = NULL;
			if (rc == 0 && !d.name)
				rc = tp_fail(c->e, TP_ENOMEM, "out of memory");
			if (rc == 0)
				rc = add_desc(c, d.pieces[0].file, &d);
			c->p->nfused += np > 1;
		}
		free(pd);
		free(ix);
		g = h;
	}
	free(ms);
	return rc;
}

static int resolve_const(vres *c, size_t k)
{
	const tp_ventry *x = &c->v->e[k];
	for (size_t i = 0; i < c->nall; i++) {
		vbind b = {.n = 0};
		if (!tmatch(x->per, c->all[i].name, &b))
			continue;
		int hit = x->per_match ? match_cond(c, k, &b) : 1;
		if (hit < 0)
			return -1;
		if (!hit)
			continue;
		char name[ST_MAX_NAME + 1];
		if (expand(x->name, &b, name, sizeof name) < 0)
			return tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu]: served name '%s' uses a variable \"per\" does not bind",
				       c->v->origin, k, x->name);
		if (lookup(c, name) >= 0)
			return tp_fail(c->e, TP_EINVAL, "%s: tensors[%zu]: the constant '%s' is also a source tensor",
				       c->v->origin, k, name);
		size_t numel = 1, esz = x->cdtype == ST_BF16 ? 2 : 4;
		for (uint32_t a = 0; a < x->rs_ndim; a++)
			numel *= (size_t)x->rs_shape[a]; /* at most TP_VIEW_CONST_MAX (view.c) */
		uint8_t *bytes = malloc(numel * esz);
		if (keep_block(c, bytes) < 0)
			return -1;
		uint32_t u = x->cbits; /* rounded to the dtype when the view was read (view.c) */
		uint16_t h = (uint16_t)u;
		for (size_t j = 0; j < numel; j++)
			memcpy(bytes + j * esz, esz == 2 ? (const void *)&h : (const void *)&u, esz);
		tp_sdesc d = {.name = keep_name(c, name), .cbytes = bytes, .dtype = x->cdtype, .ndim = x->rs_ndim};
		for (uint32_t a = 0; a < x->rs_ndim; a++)
			d.shape[a] = (uint64_t)x->rs_shape[a];
		if (!d.name)
			return tp_fail(c->e, TP_ENOMEM, "out of memory");
		if (add_desc(c, c->all[i].f, &d) < 0)
			return -1;
		c->p->nconsts++;
	}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* The sources part pt reads, sorted; its pieces' files renumbered into that table. */
static int localize(vres *c, tp_vpart *pt)
{
	size_t n = 0;
	for (size_t k = 0; k < pt->n; k++)
		n += pt->d[k].nstack ? (size_t)pt->d[k].nstack * pt->d[k].npieces : pt->d[k].npieces;
	pt->srcs = malloc((n ? n : 1) * sizeof *pt->srcs);
	if (!pt->srcs)
		return tp_fail(c->e, TP_ENOMEM, "out of memory");
	size_t w = 0;
	for (size_t k = 0; k < pt->n; k++) {
		size_t np = pt->d[k].nstack ? (size_t)pt->d[k].nstack * pt->d[k].npieces : pt->d[k].npieces;
		for (size_t j = 0; j < np; j++)
			pt->srcs[w++] = pt->d[k].pieces[j].file;
	}
	qsort(pt->srcs, w, sizeof *pt->srcs, cmp_u32);
	uint32_t u = 0;
	for (size_t k = 0; k < w; k++)
		if (!u || pt->srcs[u - 1] != pt->srcs[k])
			pt->srcs[u++] = pt->srcs[k];
	pt->nsrc = u;
	for (size_t k = 0; k < pt->n; k++) {
		size_t np = pt->d[k].nstack ? (size_t)pt->d[k].nstack * pt->d[k].npieces : pt->d[k].npieces;
		tp_pdesc *pd = (tp_pdesc *)pt->d[k].pieces;
		for (size_t j = 0; j < np; j++) {
			uint32_t *at = bsearch(&pd[j].file, pt->srcs, u, sizeof *pt->srcs, cmp_u32);
			pd[j].file = (uint32_t)(at - pt->srcs);
		}
	}
	return 0;
}

/* Whether the view's rename pair r takes source tensor `name`: its prefix, then one of its names
 * (templates) or, where it lists none, anything. */
static int renames(const tp_view *v, uint32_t r, const char *name)
{
	size_t fl = strlen(v->ren_from[r]);
	if (strncmp(name, v->ren_from[r], fl))
		return 0;
	if (!v->ren_names[r])
		return 1;
	const cJSON *x;
	cJSON_ArrayForEach(x, v->ren_names[r])
	{
		vbind b = {.n = 0};
		if (tmatch(x->valuestring, name + fl, &b))
			return 1;
	}
	return 0;
}

/* The drop entries, before every other: the source tensors they take (each entry's "if" decided per
 * match where it reads tensor() or the match's variables, over every source tensor) taken out of
 * c->all, so that no other entry, tensor() of another entry, "rename" or keep_rest sees them. c->all
 * stays sorted. Returns 0, or -1 with e set. */
static int apply_drops(vres *c)
{
	uint8_t *gone = calloc(c->nall ? c->nall : 1, 1);
	if (!gone)
		return tp_fail(c->e, TP_ENOMEM, "out of memory");
	int rc = 0;
	for (size_t k = 0; k < c->v->ne && rc == 0; k++) {
		const tp_ventry *x = &c->v->e[k];
		if (x->kind != TP_VE_DROP || (c->cfg->off && c->cfg->off[k]))
			continue;
		for (size_t i = 0; i < c->nall && rc == 0; i++) {
			vbind b = {.n = 0};
			if (gone[i] || !tmatch(x->per, c->all[i].name, &b))
				continue;
			int hit = x->per_match ? match_cond(c, k, &b) : 1;
			if (hit < 0)
				rc = -1;
			else
				gone[i] = (uint8_t)hit;
		}
	}
	size_t w = 0;
	for (size_t i = 0; i < c->nall; i++)
		if (!gone[i])
			c->all[w++] = c->all[i];
	c->nall = w;
	free(gone);
	return rc;
}

int tp_view_resolve(const tp_view *v, const tp_vcfg *cfg, const tp_vsource *src, uint32_t nsrc, tp_vplan *out,
		    tp_err *e)
{
	memset(out, 0, sizeof *out);
	static const tp_vcfg none = {0};
	vres c = {.v = v, .cfg = cfg ? cfg : &none, .src = src, .nsrc = nsrc, .p = out, .e = e};
	for (uint32_t f = 0; f < nsrc; f++)
		c.nall += src[f].h->n;
	c.all = malloc((c.nall ? c.nall : 1) * sizeof *c.all);
	c.used = calloc(c.nall ? c.nall : 1, 1);
	c.byfile = calloc(nsrc ? nsrc : 1, sizeof *c.byfile);
	int rc = 0;
	if (!c.all || !c.used || !c.byfile)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	size_t w = 0;
	for (uint32_t f = 0; f < nsrc && rc == 0; f++)
		for (size_t t = 0; t < src[f].h->n; t++)
			c.all[w++] = (vname){src[f].h->t[t].name, f, (uint32_t)t};
	if (rc == 0) {
		qsort(c.all, c.nall, sizeof *c.all, cmp_vname);
		rc = apply_drops(&c);
	}
	if (rc == 0) {
		for (size_t i = 1; i < c.nall; i++)
			if (!strcmp(c.all[i].name, c.all[i - 1].name)) {
				rc = tp_fail(e, TP_EINVAL, "%s and %s both hold tensor '%s': a view needs one tensor of each name",
					     src[c.all[i - 1].f].path, src[c.all[i].f].path, c.all[i].name);
				break;
			}
	}
	for (size_t k = 0; k < v->ne && rc == 0; k++) {
		const tp_ventry *x = &v->e[k];
		if (c.cfg->off && c.cfg->off[k])
			continue;
		if (x->kind == TP_VE_CAT)
			rc = resolve_cat(&c, k);
		else if (x->kind == TP_VE_CONST)
			rc = resolve_const(&c, k);
		/* TP_VE_DROP: applied already (apply_drops) */
	}
	for (size_t i = 0; i < c.nall && rc == 0; i++) {
		if (c.used[i])
			continue;
		const char *name = c.all[i].name;
		uint32_t r = 0; /* "rename": the first pair that takes it */
		while (r < v->nren && !renames(v, r, name))
			r++;
		if (r == v->nren && !v->keep_rest) {
			rc = tp_fail(e, TP_EPLAN, "%s: tensor '%s': view %s names no place for it (keep_rest is off, and no "
				     "\"rename\" takes it)", src[c.all[i].f].path, name, v->origin);
			break;
		}
		if (r < v->nren) {
			char nn[ST_MAX_NAME + 1];
			size_t fl = strlen(v->ren_from[r]), tl = strlen(v->ren_to[r]);
			if (tl + strlen(name + fl) >= sizeof nn) {
				rc = tp_fail(e, TP_EINVAL, "%s: tensor '%s' renamed by \"rename\" is over %d characters",
					     v->origin, name, ST_MAX_NAME);
				break;
			}
			memcpy(nn, v->ren_to[r], tl);
			memcpy(nn + tl, name + fl, strlen(name + fl) + 1);
			if (!(name = keep_name(&c, nn))) {
				rc = tp_fail(e, TP_ENOMEM, "out of memory");
				break;
			}
		}
		tp_pdesc *pd = malloc(sizeof *pd);
		if ((rc = keep_block(&c, pd)) < 0)
			break;
		*pd = (tp_pdesc){c.all[i].f, c.all[i].t, src[c.all[i].f].specs[c.all[i].t], 0};
		tp_sdesc d = {.name = name, .pieces = pd, .npieces = 1};
		rc = add_desc(&c, c.all[i].f, &d);
	}
	/* served names are unique across parts too (a loader reads every part into one dict) */
	size_t total = 0;
	for (uint32_t f = 0; f < nsrc; f++)
		total += c.byfile[f].n;
	const char **names = rc == 0 ? malloc((total ? total : 1) * sizeof *names) : NULL;
	if (rc == 0 && !names)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	if (rc == 0) {
		size_t u = 0;
		for (uint32_t f = 0; f < nsrc; f++)
			for (size_t k = 0; k < c.byfile[f].n; k++)
				names[u++] = c.byfile[f].d[k].name;
		qsort(names, u, sizeof *names, cmp_str);
		for (size_t k = 1; k < u && rc == 0; k++)
			if (!strcmp(names[k], names[k - 1]))
				rc = tp_fail(e, TP_EINVAL, "%s: served tensor '%s' is made twice (by two entries, or by an entry "
					     "and a source tensor of that name)", v->origin, names[k]);
	}
	free(names);
	out->parts = calloc(nsrc ? nsrc : 1, sizeof *out->parts);
	if (rc == 0 && !out->parts)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t f = 0; f < nsrc; f++) {
		if (rc == 0 && c.byfile[f].n) {
			c.byfile[f].file = f;
			rc = localize(&c, &c.byfile[f]);
			out->parts[out->nparts++] = c.byfile[f];
		} else {
			free(c.byfile[f].d);
			free(c.byfile[f].srcs);
		}
	}
	free(c.all);
	free(c.used);
	free(c.byfile);
	if (rc < 0)
		tp_vplan_free(out);
	return rc;
}

void tp_vplan_free(tp_vplan *p)
{
	for (size_t k = 0; k < p->nparts; k++) {
		free(p->parts[k].d);
		free(p->parts[k].srcs);
	}
	free(p->parts);
	for (size_t k = 0; k < p->nblocks; k++)
		free(p->blocks[k]);
	free(p->blocks);
	memset(p, 0, sizeof *p);
}

/* ---- built-in views ---- */
