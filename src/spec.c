/* spec.c: distributions and tensor cuts (see spec.h). All arithmetic on sizes is
 * overflow-checked: shapes come from untrusted headers and specs from user plans. */
#include "spec.h"

#include <stddef.h>
#include <string.h>

tp_spec tp_spec_replicate(void)
{
	tp_spec s;
	memset(&s, 0, sizeof s);
	s.kind = TP_REPLICATE;
	s.unit = s.div = 1;
	return s;
}

tp_spec tp_spec_split(uint32_t axis, uint64_t units, uint64_t unit)
{
	tp_spec s = tp_spec_replicate();
	s.kind = TP_SPLIT;
	s.axis = axis;
	s.nseg = 1;
	s.seg[0] = units;
	s.unit = unit;
	return s;
}

tp_spec tp_spec_owned(uint64_t units, uint64_t owner)
{
	tp_spec s = tp_spec_replicate();
	s.kind = TP_OWNED;
	s.nseg = 1;
	s.seg[0] = units;
	s.owner = owner;
	return s;
}

int tp_share_of(uint64_t units, const tp_spec *s, uint32_t T, uint32_t r, tp_share *out,
		const char *ctx, tp_err *e)
{
	if (T < 1 || T > TP_MAX_T || r >= T)
		return tp_fail(e, TP_ELIMIT, "%s: rank %u of %u is out of range (T must be 1..%d)", ctx,
			       r, T, TP_MAX_T);
	out->zeros = 0;
	if (s->pad_to > 1) {
		unsigned long long padded;
		if (tp_add64(units, s->pad_to - 1, &padded) < 0)
			return tp_fail(e, TP_EPLAN, "%s: padding %llu units overflows", ctx,
				       (unsigned long long)units);
		padded = padded / s->pad_to * s->pad_to;
		if (padded % T)
			return tp_fail(e, TP_EPLAN,
				       "%s: %llu units padded to %llu (a multiple of %llu) do not divide over %u ranks",
				       ctx, (unsigned long long)units, padded,
				       (unsigned long long)s->pad_to, T);
		uint64_t per = padded / T, first = per * r;
		uint64_t last = first + per < units ? first + per : units;
		out->first = first < units ? first : units;
		out->count = last > out->first ? last - out->first : 0;
		out->zeros = per - out->count;
		return 0;
	}
	if (units % T == 0) {
		out->first = units / T * r;
		out->count = units / T;
		return 0;
	}
	if ((s->flags & TP_GROUPS) && units < T && T % units == 0) {
		out->first = r / (T / units);
		out->count = 1;
		return 0;
	}
	if ((s->flags & TP_UNEVEN) && units >= T) {
		uint64_t base = units / T, rem = units % T;
		out->count = base + (r < rem);
		out->first = base * r + (r < rem ? r : rem);
		return 0;
	}
	const char *hint = "";
	if (units < T)
		hint = (s->flags & TP_GROUPS) ? " (replicated groups need T to be a multiple of the units)"
					       : " (fewer units than ranks; the rule does not allow replicated groups)";
	else if (!(s->flags & TP_UNEVEN))
		hint = " (the rule does not allow an uneven split)";
	return tp_fail(e, TP_EPLAN, "%s: %llu units do not divide over %u ranks%s", ctx,
		       (unsigned long long)units, T, hint);
}

/* Appends a piece, merging it with the previous one when they are adjacent in the source or
 * both zero fill. Zero-length pieces are dropped. */
static void add_piece(tp_cut *c, uint64_t off, uint64_t len)
{
	if (!len)
		return;
	if (c->np) {
		tp_piece *p = &c->piece[c->np - 1];
		if ((off == TP_ZERO && p->off == TP_ZERO) || (off != TP_ZERO && p->off != TP_ZERO && p->off + p->len == off)) {
			p->len += len;
			return;
		}
	}
	c->piece[c->np].off = off;
	c->piece[c->np].len = len;
	c->np++;
}

int tp_spec_affine(const tp_spec *s, uint32_t T)
{
	if (T < 4)
		return 0;
	if (s->kind == TP_REPLICATE || s->kind == TP_ABSENT)
		return 1;
	if (s->kind != TP_SPLIT || s->pad_to > 1)
		return 0;
	for (uint32_t k = 0; k < s->nseg; k++)
		if (s->seg[k] % T)
			return 0;
	return 1;
}

int tp_cut_tensor(const st_tensor *t, const tp_spec *s, uint32_t T, uint32_t r, tp_cut *c,
		  const char *ctx, tp_err *e)
{
	memset(c, 0, offsetof(tp_cut, piece)); /* pieces past c->np stay unset (zeroing them all was a
	                                         * seventh of a large mount) */
	c->ndim = t->ndim;
	memcpy(c->shape, t->shape, sizeof c->shape);
	uint64_t nbytes = t->end - t->begin;
	if (T < 1 || T > TP_MAX_T || r >= T)
		return tp_fail(e, TP_ELIMIT, "%s: rank %u of %u is out of range (T must be 1..%d)", ctx,
			       r, T, TP_MAX_T);
	if (s->kind == TP_ABSENT)
		return tp_fail(e, TP_EPLAN, "%s: an absent tensor has no cut", ctx);
	if (s->kind == TP_OWNED) {
		tp_share sh;
		if (s->owner >= s->seg[0])
			return tp_fail(e, TP_EPLAN, "%s: belongs to unit %llu of %llu, past the last", ctx,
				       (unsigned long long)s->owner, (unsigned long long)s->seg[0]);
		if (tp_share_of(s->seg[0], s, T, r, &sh, ctx, e) < 0)
			return -1;
		if ((s->flags & TP_EP_RR) ? s->owner % T != r : s->owner < sh.first || s->owner - sh.first >= sh.count) {
			c->absent = 1;
			return 0;
		}
	}
	if (s->kind == TP_REPLICATE || s->kind == TP_OWNED) {
		c->size = nbytes;
		c->outer = nbytes ? 1 : 0;
		c->stride = c->rep = nbytes;
		add_piece(c, 0, nbytes);
		return 0;
	}
	if (s->axis >= t->ndim)
		return tp_fail(e, TP_EPLAN, "%s: split axis %u but the tensor has %u dimension%s", ctx,
			       s->axis, t->ndim, t->ndim == 1 ? "" : "s");
	if (s->nseg < 1 || s->nseg > TP_MAX_SEG || s->unit < 1 || s->div < 1)
		return tp_fail(e, TP_EPLAN, "%s: malformed spec (%u segments, unit %llu, divisor %llu)",
			       ctx, s->nseg, (unsigned long long)s->unit, (unsigned long long)s->div);

	/* Logical axis length, and its stored length ceil(L / div). */
	unsigned long long units = 0, L = 0, segl;
	for (uint32_t i = 0; i < s->nseg; i++)
		if (tp_add64(units, s->seg[i], &units) < 0 || tp_mul64(s->seg[i], s->segu[i] ? s->segu[i] : s->unit, &segl) < 0 ||
		    tp_add64(L, segl, &L) < 0)
			return tp_fail(e, TP_EPLAN, "%s: segment sizes overflow", ctx);
	uint64_t S = t->shape[s->axis];
	uint64_t want = L / s->div + (L % s->div != 0);
	if (S != want) {
		if (s->div == 1 && s->nseg == 1)
			return tp_fail(e, TP_EPLAN,
				       "%s: axis %u has %llu elements but the rule describes %llu (%llu units of %llu)",
				       ctx, s->axis, (unsigned long long)S, L, units,
				       (unsigned long long)s->unit);
		if (s->div == 1)
			return tp_fail(e, TP_EPLAN, "%s: axis %u has %llu elements but the rule's %u segments describe %llu",
				       ctx, s->axis, (unsigned long long)S, s->nseg, L);
		return tp_fail(e, TP_EPLAN,
			       "%s: axis %u has %llu stored elements but %llu logical features at %llu per stored element need %llu",
			       ctx, s->axis, (unsigned long long)S, L, (unsigned long long)s->div,
			       (unsigned long long)want);
	}

	/* Bits of one index step on the axis, and repetitions before it. */
	unsigned long long inner = st_dtype_bits(t->dtype), outer = 1;
	for (uint32_t i = s->axis + 1; i < t->ndim; i++)
		if (tp_mul64(inner, t->shape[i], &inner) < 0)
			return tp_fail(e, TP_EINVAL, "%s: shape overflows", ctx);
	for (uint32_t i = 0; i < s->axis; i++)
		if (tp_mul64(outer, t->shape[i], &outer) < 0)
			return tp_fail(e, TP_EINVAL, "%s: shape overflows", ctx);
	unsigned long long stride_bits;
	if (tp_mul64(S, inner, &stride_bits) < 0)
		return tp_fail(e, TP_EINVAL, "%s: shape overflows", ctx);

	uint64_t local = 0, seg_lo = 0;
	for (uint32_t i = 0; i < s->nseg; i++) {
		tp_share sh;
		/* the segment's context, formatted only for a message (formatting it on every call was
		 * most of the time of planning a large checkpoint) */
		char sctxb[TP_ERR_MSG];
#define sctx (s->nseg > 1 ? (tp_fmt(sctxb, sizeof sctxb, "%s: segment %u", ctx, i), sctxb) : ctx)
		if (tp_share_of(s->seg[i], s, T, r, &sh, "", NULL) < 0)
			return tp_share_of(s->seg[i], s, T, r, &sh, sctx, e);
		uint64_t u = s->segu[i] ? s->segu[i] : s->unit;
		uint64_t lo = seg_lo + sh.first * u, hi = lo + sh.count * u;
		seg_lo += s->seg[i] * u;
		if (sh.count) {
			if (lo % s->div || (hi % s->div && hi != L))
				return tp_fail(e, TP_EPLAN,
					       "%s: the cut at feature %llu of axis %u falls inside a block of %llu features "
					       "(one stored element covers %llu; rank %u would keep features [%llu, %llu))",
					       sctx, (unsigned long long)(lo % s->div ? lo : hi), s->axis,
					       (unsigned long long)s->div, (unsigned long long)s->div, r, (unsigned long long)lo,
					       (unsigned long long)hi);
			uint64_t slo = lo / s->div, shi = hi / s->div + (hi % s->div != 0);
			unsigned long long ob, lb;
			if (tp_mul64(slo, inner, &ob) < 0 || tp_mul64(shi - slo, inner, &lb) < 0)
				return tp_fail(e, TP_EINVAL, "%s: shape overflows", ctx);
			if (ob % 8 || lb % 8)
				return tp_fail(e, TP_EPLAN,
					       "%s: the cut at element %llu of axis %u is not on a byte boundary (%s packs %u bits per element)",
					       sctx, (unsigned long long)(ob % 8 ? slo : shi), s->axis,
					       st_dtype_name(t->dtype), st_dtype_bits(t->dtype));
			local += shi - slo;
			if (outer && inner)
				add_piece(c, ob / 8, lb / 8);
		}
		if (sh.zeros) {
			unsigned long long zl, zb;
			if (tp_mul64(sh.zeros, u, &zl) < 0 || zl % s->div)
				return tp_fail(e, TP_EPLAN,
					       "%s: %llu padding units do not cover whole stored elements of %llu",
					       sctx, (unsigned long long)sh.zeros, (unsigned long long)s->div);
			zl /= s->div;
			if (tp_mul64(zl, inner, &zb) < 0 || zb % 8)
				return tp_fail(e, TP_EPLAN, "%s: padding is not a whole number of bytes", sctx);
			local += zl;
			if (outer && inner)
				add_piece(c, TP_ZERO, zb / 8);
		}
#undef sctx
	}
	c->shape[s->axis] = local;
	if (outer > 1 && stride_bits % 8)
		return tp_fail(e, TP_EPLAN,
			       "%s: rows of axis %u are %llu bits, not whole bytes, so they cannot be cut",
			       ctx, s->axis, stride_bits);
	for (uint32_t i = 0; i < c->np; i++)
		c->rep += c->piece[i].len;
	c->stride = stride_bits / 8;
	c->outer = c->rep ? outer : 0;
	/* One source piece as wide as the stride: the whole cut is one contiguous run. */
	if (c->np == 1 && c->piece[0].off != TP_ZERO && c->piece[0].len == c->stride && c->outer > 1) {
		c->piece[0].len *= c->outer;
		c->rep = c->stride = c->piece[0].len;
		c->outer = 1;
	}
	unsigned long long size;
	if (tp_mul64(c->outer, c->rep, &size) < 0)
		return tp_fail(e, TP_EINVAL, "%s: local size overflows", ctx);
	c->size = size;
	return 0;
}

void tp_spec_working_ts(const st_tensor *t, const tp_spec *s, uint32_t maxT, char *buf, size_t n)
{
	size_t w = 0;
	int found = 0;
	buf[0] = 0;
	for (uint32_t T = 1; T <= maxT && found < 12; T++) {
		int ok = 1;
		for (uint32_t r = 0; r < T && ok; r++) {
			tp_cut c;
			ok = tp_cut_tensor(t, s, T, r, &c, "", NULL) == 0;
		}
		if (ok && w < n) {
			tp_fmt(buf + w, n - w, "%s%u", found ? ", " : "", T);
			w += strlen(buf + w);
			found++;
		}
	}
	if (!found)
		tp_fmt(buf, n, "none");
}
