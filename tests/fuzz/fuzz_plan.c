/* fuzz_plan.c: libFuzzer target for plan files, expressions and resolution. The input is a plan
 * file and a config.json separated by a line "----". The plan is resolved against a fixed set of
 * tensors of real names and shapes (dense attention, MLA, KDA, GDN, MoE, quantized companions) and
 * each resolved spec is cut for T in {1, 2, 3, 4}, without and with expert parallelism. Nothing may crash or leak; a cut that succeeds
 * must give a local size equal to its program's. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

static const struct {
	const char *name;
	st_dtype dtype;
	uint32_t ndim;
	uint64_t shape[4];
} fixed[] = {
	{"model.embed_tokens.weight", ST_BF16, 2, {96, 32}},
	{"lm_head.weight", ST_BF16, 2, {96, 32}},
	{"model.layers.0.self_attn.q_proj.weight", ST_BF16, 2, {64, 32}},
	{"model.layers.0.self_attn.q_proj.bias", ST_BF16, 1, {64}},
	{"model.layers.0.self_attn.k_proj.weight", ST_BF16, 2, {16, 32}},
	{"model.layers.0.self_attn.o_proj.weight", ST_BF16, 2, {32, 64}},
	{"model.layers.0.self_attn.o_proj.bias", ST_BF16, 1, {32}},
	{"model.layers.1.self_attn.q_b_proj.weight", ST_F8_E4M3, 2, {384, 128}},
	{"model.layers.1.self_attn.q_b_proj.weight_scale_inv", ST_F32, 2, {3, 1}},
	{"model.layers.1.self_attn.kv_b_proj.weight", ST_U8, 2, {256, 64}},
	{"model.layers.1.self_attn.kv_b_proj.weight_scale", ST_F8_E4M3, 2, {256, 8}},
	{"model.layers.1.self_attn.kv_b_proj.weight_scale_2", ST_F32, 0, {0}},
	{"model.layers.2.self_attn.A_log", ST_F32, 4, {1, 1, 8, 1}},
	{"model.layers.2.self_attn.dt_bias", ST_F32, 1, {64}},
	{"model.layers.2.self_attn.q_conv1d.weight", ST_BF16, 3, {64, 1, 4}},
	{"model.layers.3.linear_attn.conv1d.weight", ST_BF16, 3, {40, 1, 4}},
	{"model.layers.3.mlp.experts.7.down_proj.weight", ST_F4, 2, {32, 48}},
	{"model.layers.3.mlp.gate.e_score_correction_bias", ST_F32, 1, {8}},
	{"model.layers.4.mlp.experts.gate_up_proj", ST_BF16, 3, {8, 64, 32}},
};
#define NFIXED (sizeof fixed / sizeof fixed[0])

static st_tensor tensors[NFIXED];

static const st_tensor *lookup(void *ctx, const char *name)
{
	(void)ctx;
	for (size_t i = 0; i < NFIXED; i++)
		if (!strcmp(tensors[i].name, name))
			return &tensors[i];
	return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	for (size_t i = 0; i < NFIXED; i++) {
		st_tensor *t = &tensors[i];
		memset(t, 0, sizeof *t);
		t->name = fixed[i].name;
		t->dtype = fixed[i].dtype;
		t->ndim = fixed[i].ndim;
		uint64_t bits = st_dtype_bits(t->dtype);
		for (uint32_t d = 0; d < t->ndim; d++) {
			t->shape[d] = fixed[i].shape[d];
			bits *= t->shape[d];
		}
		t->end = bits / 8;
	}
	const char *sep = memmem(data, size, "\n----\n", 6);
	size_t plen = sep ? (size_t)(sep - (const char *)data) : size;
	tp_plan pl;
	tp_err e;
	if (tp_plan_parse((const char *)data, plen, "fuzz", &pl, &e) < 0)
		return 0;
	cJSON *cfg = sep ? cJSON_ParseWithLength(sep + 6, size - plen - 6) : NULL;
	tp_expr_ctx cx;
	memset(&cx, 0, sizeof cx);
	cx.config = cfg;
	cx.nprefix = pl.nprefix;
	for (int i = 0; i < pl.nprefix; i++)
		cx.prefix[i] = pl.prefix[i];
	const uint32_t Ts[] = {1, 2, 3, 4};
	for (int ti = 0; ti < 8; ti++) { /* each T without, then with expert parallelism */
		tp_resolve_opts o = {.T = Ts[ti % 4], .pad_vocab = ti == 2 ? 64 : 0, .ep = ti >= 4};
		int64_t E[TP_MAX_EXPERT_DECLS];
		if (o.ep && tp_plan_ep_check(&pl, &cx, o.T, 0, E, &e) < 0)
			continue;
		for (size_t i = 0; i < NFIXED; i++) {
			tp_resolved res;
			if (tp_plan_resolve(&pl, &cx, &tensors[i], lookup, NULL, &o, "fuzz", &res, &e) < 0)
				continue;
			for (uint32_t r = 0; r < o.T; r++) {
				tp_cut c;
				if (tp_cut_tensor(&tensors[i], &res.spec, o.T, r, &c, "fuzz", &e) < 0)
					break;
				uint64_t sum = 0;
				for (uint32_t k = 0; k < c.np; k++)
					sum += c.piece[k].len;
				if (sum != c.rep || c.outer * c.rep != c.size)
					abort();
			}
		}
	}
	cJSON_Delete(cfg);
	tp_plan_free(&pl);
	return 0;
}
