/* tensor_index.c: the checkpoint-wide tensor index for companions (see tensor_index.h). */
#include "tensor_index.h"

#include <stdlib.h>
#include <string.h>

static int cmp_ent(const void *a, const void *b)
{
	const tp_tindex_ent *x = a, *y = b;
	if (x->dir != y->dir)
		return x->dir < y->dir ? -1 : 1;
	return strcmp(x->t->name, y->t->name);
}

int tp_tindex_build(tp_tindex *x, const tp_model *m, int strict, tp_err *e)
{
	memset(x, 0, sizeof *x);
	x->ix = malloc((m->ntensors ? m->ntensors : 1) * sizeof *x->ix);
	if (!x->ix)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < m->nn; i++)
		if (m->n[i].kind == TN_TENSORS)
			for (size_t k = 0; k < m->n[i].h.n && x->n < m->ntensors; k++)
				x->ix[x->n++] = (tp_tindex_ent){m->n[i].parent, &m->n[i].h.t[k]};
	qsort(x->ix, x->n, sizeof *x->ix, cmp_ent);
	for (size_t k = 1; k < x->n; k++) {
		if (x->ix[k].dir != x->ix[k - 1].dir || strcmp(x->ix[k].t->name, x->ix[k - 1].t->name))
			continue;
		if (strict) {
			tp_fail(e, TP_EINVAL, "tensor '%s' appears in two files of one folder (--strict)", x->ix[k].t->name);
			tp_tindex_free(x);
			return -1;
		}
		if (m->o->log) {
			char msg[TP_ERR_MSG];
			tp_fmt(msg, sizeof msg, "tensor '%s' appears in two files of one folder", x->ix[k].t->name);
			m->o->log(m->o->ctx, 0, msg);
		}
	}
	return 0;
}

void tp_tindex_free(tp_tindex *x)
{
	free(x->ix);
	memset(x, 0, sizeof *x);
}

const st_tensor *tp_tindex_lookup(void *vx, const char *name)
{
	const tp_tindex *c = vx;
	size_t lo = 0, hi = c->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const tp_tindex_ent *x = &c->ix[mid];
		int k = c->dir != x->dir ? (c->dir < x->dir ? -1 : 1) : strcmp(name, x->t->name);
		if (k == 0)
			return x->t;
		if (k < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}
