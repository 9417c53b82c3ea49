/* view_pp.c: pipeline stages under an engine view (see view.h): which layers each stage holds,
 * as vLLM divides them, and which stage holds each served tensor, from the view's "pp" rules.
 * A stage's files hold exactly the tensors of its modules (vLLM's sharded_state loader raises
 * KeyError on any other), so a tensor the rules do not place is refused by name. Pure: no I/O. */
#include "view.h"

#include <stdio.h>
#include <string.h>

int tp_pp_partition(uint64_t nlayers, uint32_t P, const uint32_t *given, uint64_t *start, tp_err *e)
{
	if (P < 1 || P > TP_PP_MAX)
		return tp_fail(e, TP_EINVAL, "--pp %u: from 1 to %d stages", P, TP_PP_MAX);
	uint64_t n[TP_PP_MAX], sum = 0;
	for (uint32_t s = 0; s < P; s++)
		n[s] = given ? given[s] : nlayers / P;
	if (!given) /* the remainder, one each, to the stages before the last, counted back from it */
		for (uint64_t k = 0; k < nlayers % P; k++)
			n[P - 2 - k]++;
	start[0] = 0;
	for (uint32_t s = 0; s < P; s++) {
		if (n[s] == 0)
			return tp_fail(e, TP_EINVAL, "--pp %u: stage %u would hold no layer (%llu layers%s): vLLM builds every "
				       "stage from at least one layer; use fewer stages", P, s, (unsigned long long)nlayers,
				       given ? " as --pp-layers divides them" : "");
		sum += n[s];
		start[s + 1] = sum;
	}
	if (sum != nlayers)
		return tp_fail(e, TP_EINVAL, "--pp-layers: the stages hold %llu layers where config.json has %llu",
			       (unsigned long long)sum, (unsigned long long)nlayers);
	return 0;
}

static int starts_with_any(const char *name, const char *const *pre, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++)
		if (!strncmp(name, pre[k], strlen(pre[k])))
			return 1;
	return 0;
}

int tp_view_stage(const tp_view *v, const char *name, uint32_t P, const uint64_t *start, tp_err *e)
{
	size_t pl = strlen(v->pp_layers);
	if (!strncmp(name, v->pp_layers, pl) && name[pl] >= '0' && name[pl] <= '9') {
		const char *p = name + pl;
		uint64_t n = 0;
		for (; *p >= '0' && *p <= '9'; p++)
			n = n > UINT64_MAX / 10 ? UINT64_MAX : n * 10 + (uint64_t)(*p - '0');
		if (*p == '.') {
			for (uint32_t s = 0; s < P; s++)
				if (n >= start[s] && n < start[s + 1])
					return (int)s;
			return tp_fail(e, TP_EPLAN, "%s: tensor '%s' is in layer %llu, past the %llu layers config.json's '%s' "
				       "counts: no pipeline stage holds it", v->origin, name, (unsigned long long)n,
				       (unsigned long long)start[P], v->pp_count);
		}
	}
	if (starts_with_any(name, v->pp_every, v->npp_every))
		return TP_PP_EVERY;
	if (starts_with_any(name, v->pp_first, v->npp_first))
		return 0;
	if (starts_with_any(name, v->pp_last, v->npp_last))
		return (int)P - 1;
	char rules[512];
	size_t w = (size_t)snprintf(rules, sizeof rules, "%s<N>.", v->pp_layers);
	const char *const *lists[3] = {v->pp_first, v->pp_last, v->pp_every};
	const uint32_t ns[3] = {v->npp_first, v->npp_last, v->npp_every};
	static const char *const what[3] = {"first", "last", "every stage"};
	for (int l = 0; l < 3; l++)
		for (uint32_t k = 0; k < ns[l] && w < sizeof rules; k++)
			w += (size_t)snprintf(rules + w, sizeof rules - w, ", %s (%s)", lists[l][k], what[l]);
	return tp_fail(e, TP_EPLAN, "%s: tensor '%s': which pipeline stage holds it is not known (the view's \"pp\" "
		       "places %s); refused rather than guessed", v->origin, name, rules);
}
