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

int tp_tindex_build(tp_tindex *x, const tp_tindex_file *f, size_t nf, int strict, tp_log_fn log, void *lctx,
		    tp_err *e)
{
	memset(x, 0, sizeof *x);
	size_t total = 0;
	for (size_t i = 0; i < nf; i++)
		total += f[i].h->n;
	x->ix = malloc((total ? total : 1) * sizeof *x->ix);
	if (!x->ix)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (size_t i = 0; i < nf; i++)
		for (size_t k = 0; k < f[i].h->n; k++)
			x->ix[x->n++] = (tp_tindex_ent){f[i].dir, &f[i].h->t[k]};
	qsort(x->ix, x->n, sizeof *x->ix, cmp_ent);
	for (size_t k = 1; k < x->n; k++) {
		if (x->ix[k].dir != x->ix[k - 1].dir || strcmp(x->ix[k].t->name, x->ix[k - 1].t->name))
			continue;
		if (strict) {
			tp_fail(e, TP_EINVAL, "tensor '%s' appears in two files of one folder (--strict)", x->ix[k].t->name);
			tp_tindex_free(x);
			return -1;
		}
		tp_logf(log, lctx, 0, "tensor '%s' appears in two files of one folder", x->ix[k].t->name);
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
