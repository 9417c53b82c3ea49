/* test_plan.c: plan choice and resolution without a mount. Every built-in plan is resolved on a
 * header-only checkpoint of its family (tensor names and shapes as the real checkpoints have
 * them, no data), and each tensor's kind, axis, units, unit width, distribution and divisor is
 * compared with an expectation written by hand from the TP rules (tp-rules.md: Megatron
 * column/row, whole heads, KV groups, MLA heads uneven, KDA per head / per channel, GDN
 * segments, vocab-parallel; quantized companions at the same logical cut), not from the C
 * output. Also: split kinds (the table, an unknown kind refused), plan-file errors (TP_ERULE,
 * naming plan and rule) against tensors that cannot be cut (TP_EPLAN), and tp_model_open on a
 * missing folder (the ASan build checks it leaks nothing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "planner.h"

#define MAXT 64

/* One tensor of a header-only checkpoint and what the rules say rank shares are cut from. */
typedef struct want {
	const char *name;
	st_dtype dt;
	uint32_t ndim;
	uint64_t shape[4];
	int split;       /* 0: replicated whole; 1: split */
	uint32_t axis;
	uint64_t units;  /* one segment: units on the axis */
	uint64_t unit;   /* logical elements per unit */
	uint32_t flags;  /* TP_UNEVEN, TP_GROUPS */
	uint64_t div;    /* logical elements per stored element */
} want;

#define REPL(n, d, nd, ...) {n, d, nd, {__VA_ARGS__}, 0, 0, 0, 0, 0, 0}

typedef struct ckpt {
	st_tensor t[MAXT];
	size_t n;
} ckpt;

static ckpt ck;

static const st_tensor *lookup(void *ctx, const char *name)
{
	ckpt *c = ctx;
	for (size_t i = 0; i < c->n; i++)
		if (!strcmp(c->t[i].name, name))
			return &c->t[i];
	return NULL;
}

static void load(const want *w, size_t n)
{
	memset(&ck, 0, sizeof ck);
	assert_true(n <= MAXT);
	for (size_t i = 0; i < n; i++) {
		st_tensor *t = &ck.t[i];
		t->name = w[i].name;
		t->dtype = w[i].dt;
		t->ndim = w[i].ndim;
		uint64_t bits = st_dtype_bits(t->dtype);
		for (uint32_t d = 0; d < t->ndim; d++) {
			t->shape[d] = w[i].shape[d];
			bits *= t->shape[d];
		}
		t->end = bits / 8;
	}
	ck.n = n;
}

/* Chooses the plan for config (want_plan: NULL to detect, expecting `expect_plan`), resolves
 * every tensor at T and compares with the expectations. */
static void check_plan(const char *config_text, const char *want_plan, const char *expect_plan, const want *w,
		       size_t n, uint32_t T, uint64_t pad)
{
	cJSON *cfg = cJSON_Parse(config_text);
	assert_non_null(cfg);
	tp_plan pl;
	tp_err e;
	char origin[256];
	if (tp_plan_choose(cfg, want_plan, &pl, origin, sizeof origin, &e) != 0)
		fail_msg("plan choice: %s", e.msg);
	if (strcmp(pl.name, expect_plan))
		fail_msg("chose plan '%s' (%s), want '%s'", pl.name, origin, expect_plan);
	tp_expr_ctx cx;
	memset(&cx, 0, sizeof cx);
	cx.config = cfg;
	cx.nprefix = pl.nprefix;
	for (int i = 0; i < pl.nprefix; i++)
		cx.prefix[i] = pl.prefix[i];
	load(w, n);
	tp_resolve_opts o = {.T = T, .pad_vocab = pad};
	for (size_t i = 0; i < n; i++) {
		tp_resolved res;
		if (tp_plan_resolve(&pl, &cx, &ck.t[i], lookup, &ck, &o, "ckpt", &res, &e) < 0)
			fail_msg("plan %s: %s", expect_plan, e.msg);
		const tp_spec *s = &res.spec;
		const want *x = &w[i];
		if (!x->split) {
			if (s->kind != TP_REPLICATE)
				fail_msg("plan %s: %s: split (%s), want replicated", expect_plan, x->name, res.why);
			continue;
		}
		if (s->kind != TP_SPLIT || s->axis != x->axis || s->nseg != 1 || s->seg[0] != x->units || s->unit != x->unit ||
		    s->flags != x->flags || s->div != x->div || (pad && !s->pad_to))
			fail_msg("plan %s: %s: kind %d axis %u nseg %u units %llu unit %llu flags %u div %llu (%s); "
				 "want axis %u, %llu units of %llu, flags %u, div %llu",
				 expect_plan, x->name, s->kind, s->axis, s->nseg, (unsigned long long)s->seg[0],
				 (unsigned long long)s->unit, s->flags, (unsigned long long)s->div, res.why, x->axis,
				 (unsigned long long)x->units, (unsigned long long)x->unit, x->flags, (unsigned long long)x->div);
		/* every rank can cut it at T (the distribution the rules allow) */
		if (tp_plan_check_ranks(&ck.t[i], s, T, x->name, &e) < 0)
			fail_msg("plan %s: %s at T=%u: %s", expect_plan, x->name, T, e.msg);
	}
	tp_plan_free(&pl);
	cJSON_Delete(cfg);
}

/* ---- llama: H = 8 heads of 6, KV = 2, D = 48, I = 96, V = 128 ---- */

static const char *llama_cfg =
	"{\"model_type\": \"llama\", \"hidden_size\": 48, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
	" \"head_dim\": 6, \"intermediate_size\": 96, \"vocab_size\": 128}";

static const want llama[] = {
	{"model.embed_tokens.weight", ST_BF16, 2, {128, 48}, 1, 0, 128, 1, 0, 1},
	{"lm_head.weight", ST_BF16, 2, {128, 48}, 1, 0, 128, 1, 0, 1},
	{"model.layers.0.self_attn.q_proj.weight", ST_BF16, 2, {48, 48}, 1, 0, 8, 6, 0, 1},
	{"model.layers.0.self_attn.q_proj.bias", ST_BF16, 1, {48}, 1, 0, 8, 6, 0, 1},
	{"model.layers.0.self_attn.k_proj.weight", ST_BF16, 2, {12, 48}, 1, 0, 2, 6, TP_GROUPS, 1},
	{"model.layers.0.self_attn.v_proj.weight", ST_BF16, 2, {12, 48}, 1, 0, 2, 6, TP_GROUPS, 1},
	{"model.layers.0.self_attn.v_proj.bias", ST_BF16, 1, {12}, 1, 0, 2, 6, TP_GROUPS, 1},
	{"model.layers.0.self_attn.o_proj.weight", ST_BF16, 2, {48, 48}, 1, 1, 8, 6, 0, 1},
	REPL("model.layers.0.self_attn.o_proj.bias", ST_BF16, 1, 48),
	REPL("model.layers.0.self_attn.q_norm.weight", ST_BF16, 1, 6),
	{"model.layers.0.mlp.gate_proj.weight", ST_BF16, 2, {96, 48}, 1, 0, 96, 1, 0, 1},
	{"model.layers.0.mlp.up_proj.weight", ST_BF16, 2, {96, 48}, 1, 0, 96, 1, 0, 1},
	{"model.layers.0.mlp.down_proj.weight", ST_BF16, 2, {48, 96}, 1, 1, 96, 1, 0, 1},
	REPL("model.layers.0.input_layernorm.weight", ST_BF16, 1, 48),
	REPL("model.layers.0.post_attention_layernorm.weight", ST_BF16, 1, 48),
	REPL("model.norm.weight", ST_BF16, 1, 48),
	REPL("model.layers.0.self_attn.rotary_emb.inv_freq", ST_F32, 1, 3),
	REPL("model.visual.blocks.0.attn.qkv.weight", ST_BF16, 2, 48, 16),
};

static void test_llama(void **state)
{
	(void)state;
	size_t n = sizeof llama / sizeof llama[0];
	check_plan(llama_cfg, NULL, "llama", llama, n, 2, 0);
	check_plan(llama_cfg, NULL, "llama", llama, n, 4, 0); /* 2 KV heads at T = 4: replicated groups */
	check_plan(llama_cfg, "llama", "llama", llama, n, 8, 0);
}

/* ---- qwen-moe: dense attention of llama; E = 4 experts of I_moe = 32, shared expert 64 ---- */

static const char *qwen_moe_cfg =
	"{\"model_type\": \"qwen3_moe\", \"hidden_size\": 48, \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
	" \"head_dim\": 6, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 64,"
	" \"intermediate_size\": 96, \"vocab_size\": 128}";

static const want qwen_moe[] = {
	{"model.layers.1.self_attn.q_proj.weight", ST_BF16, 2, {48, 48}, 1, 0, 8, 6, 0, 1},
	{"model.layers.1.self_attn.k_proj.weight", ST_BF16, 2, {24, 48}, 1, 0, 4, 6, TP_GROUPS, 1},
	REPL("model.layers.1.self_attn.k_norm.weight", ST_BF16, 1, 6),
	REPL("model.layers.1.mlp.gate.weight", ST_BF16, 2, 4, 48),
	REPL("model.layers.1.mlp.shared_expert_gate.weight", ST_BF16, 2, 1, 48),
	{"model.layers.1.mlp.experts.3.gate_proj.weight", ST_BF16, 2, {32, 48}, 1, 0, 32, 1, TP_EXPERT, 1},
	{"model.layers.1.mlp.experts.3.up_proj.weight", ST_BF16, 2, {32, 48}, 1, 0, 32, 1, TP_EXPERT, 1},
	{"model.layers.1.mlp.experts.3.down_proj.weight", ST_BF16, 2, {48, 32}, 1, 1, 32, 1, TP_EXPERT, 1},
	{"model.layers.1.mlp.shared_expert.up_proj.weight", ST_BF16, 2, {64, 48}, 1, 0, 64, 1, 0, 1},
	{"model.layers.1.mlp.shared_expert.down_proj.weight", ST_BF16, 2, {48, 64}, 1, 1, 64, 1, 0, 1},
	{"model.layers.0.mlp.down_proj.weight", ST_BF16, 2, {48, 96}, 1, 1, 96, 1, 0, 1},
};

static void test_qwen_moe(void **state)
{
	(void)state;
	check_plan(qwen_moe_cfg, NULL, "qwen-moe", qwen_moe, sizeof qwen_moe / sizeof qwen_moe[0], 2, 0);
}

/* ---- deepseek: MLA with H = 4 heads (dn 8, dr 4, dv 6), q_lora 24, kv_lora 16, D = 32 ---- */

static const char *deepseek_cfg =
	"{\"model_type\": \"deepseek_v32\", \"hidden_size\": 32, \"num_attention_heads\": 4, \"q_lora_rank\": 24,"
	" \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6,"
	" \"moe_intermediate_size\": 24, \"n_shared_experts\": 2, \"intermediate_size\": 48, \"vocab_size\": 96,"
	" \"index_n_heads\": 4, \"index_head_dim\": 8}";

static const want deepseek[] = {
	REPL("model.layers.0.self_attn.q_a_proj.weight", ST_BF16, 2, 24, 32),
	REPL("model.layers.0.self_attn.q_a_layernorm.weight", ST_BF16, 1, 24),
	REPL("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", ST_BF16, 2, 20, 32),
	REPL("model.layers.0.self_attn.kv_a_layernorm.weight", ST_BF16, 1, 16),
	{"model.layers.0.self_attn.q_b_proj.weight", ST_BF16, 2, {48, 24}, 1, 0, 4, 12, TP_UNEVEN, 1},
	{"model.layers.0.self_attn.kv_b_proj.weight", ST_BF16, 2, {56, 16}, 1, 0, 4, 14, TP_UNEVEN, 1},
	{"model.layers.0.self_attn.o_proj.weight", ST_BF16, 2, {32, 24}, 1, 1, 4, 6, TP_UNEVEN, 1},
	REPL("model.layers.0.self_attn.indexer.wq_b.weight", ST_BF16, 2, 32, 24),
	REPL("model.layers.0.self_attn.indexer.weights_proj.weight", ST_BF16, 2, 4, 32),
	REPL("model.layers.1.mlp.gate.weight", ST_BF16, 2, 4, 32),
	REPL("model.layers.1.mlp.gate.e_score_correction_bias", ST_F32, 1, 4),
	{"model.layers.1.mlp.experts.0.gate_proj.weight", ST_BF16, 2, {24, 32}, 1, 0, 24, 1, TP_EXPERT, 1},
	{"model.layers.1.mlp.experts.0.down_proj.weight", ST_BF16, 2, {32, 24}, 1, 1, 24, 1, TP_EXPERT, 1},
	{"model.layers.1.mlp.shared_experts.up_proj.weight", ST_BF16, 2, {48, 32}, 1, 0, 48, 1, 0, 1},
	{"model.layers.1.mlp.shared_experts.down_proj.weight", ST_BF16, 2, {32, 48}, 1, 1, 48, 1, 0, 1},
	{"model.layers.2.embed_tokens.weight", ST_BF16, 2, {96, 32}, 1, 0, 96, 1, 0, 1},
	{"model.layers.2.shared_head.head.weight", ST_BF16, 2, {96, 32}, 1, 0, 96, 1, 0, 1},
	REPL("model.layers.2.eh_proj.weight", ST_BF16, 2, 32, 64),
	REPL("model.layers.2.enorm.weight", ST_BF16, 1, 32),
};

static void test_deepseek(void **state)
{
	(void)state;
	size_t n = sizeof deepseek / sizeof deepseek[0];
	check_plan(deepseek_cfg, NULL, "deepseek", deepseek, n, 2, 0);
	check_plan(deepseek_cfg, NULL, "deepseek", deepseek, n, 3, 0); /* 4 heads over 3: uneven 2/1/1 */
}

/* ---- kda (GLM-5.3 layout under text_config): KDA layer 0 with 4 heads of 8, MLA layer 1 ---- */

static const char *kda_cfg =
	"{\"model_type\": \"glm5_next\", \"text_config\": {\"hidden_size\": 32, \"num_attention_heads\": 4,"
	" \"layer_types\": [\"linear_attention\", \"full_attention\"],"
	" \"linear_attn_config\": {\"num_heads\": 4, \"head_dim\": 8, \"short_conv_kernel_size\": 4},"
	" \"q_lora_rank\": 24, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6,"
	" \"moe_intermediate_size\": 24, \"vocab_size\": 96}}";

#define KL "model.language_model.layers.0.self_attn."
static const want kda[] = {
	{KL "q_proj.weight", ST_BF16, 2, {32, 32}, 1, 0, 4, 8, 0, 1},
	{KL "k_proj.weight", ST_BF16, 2, {32, 32}, 1, 0, 4, 8, 0, 1},
	{KL "v_proj.weight", ST_BF16, 2, {32, 32}, 1, 0, 4, 8, 0, 1},
	{KL "q_conv1d.weight", ST_BF16, 3, {32, 1, 4}, 1, 0, 4, 8, 0, 1},
	REPL(KL "f_a_proj.weight", ST_BF16, 2, 8, 32),
	{KL "f_b_proj.weight", ST_BF16, 2, {32, 8}, 1, 0, 4, 8, 0, 1},
	REPL(KL "g_a_proj.weight", ST_BF16, 2, 8, 32),
	{KL "g_b_proj.weight", ST_BF16, 2, {32, 8}, 1, 0, 4, 8, 0, 1},
	{KL "b_proj.weight", ST_BF16, 2, {4, 32}, 1, 0, 4, 1, 0, 1},
	{KL "A_log", ST_F32, 4, {1, 1, 4, 1}, 1, 2, 4, 1, 0, 1},   /* per head, on the axis of size H */
	{KL "dt_bias", ST_F32, 1, {32}, 1, 0, 4, 8, 0, 1},          /* per channel, whole heads of 8 */
	REPL(KL "o_norm.weight", ST_BF16, 1, 8),
	{KL "o_proj.weight", ST_BF16, 2, {32, 32}, 1, 1, 4, 8, 0, 1},
	{"model.language_model.layers.1.self_attn.q_b_proj.weight", ST_BF16, 2, {48, 24}, 1, 0, 4, 12, TP_UNEVEN, 1},
	{"model.language_model.layers.1.self_attn.o_proj.weight", ST_BF16, 2, {32, 24}, 1, 1, 4, 6, TP_UNEVEN, 1},
	{"model.language_model.layers.1.block_sparse_moe.experts.2.w1.weight", ST_BF16, 2, {24, 32}, 1, 0, 24, 1, TP_EXPERT, 1},
	{"model.language_model.layers.1.block_sparse_moe.experts.2.w2.weight", ST_BF16, 2, {32, 24}, 1, 1, 24, 1, TP_EXPERT, 1},
	REPL("model.language_model.layers.1.block_sparse_moe.gate.weight", ST_BF16, 2, 4, 32),
	REPL("model.visual.blocks.0.mlp.fc1.weight", ST_BF16, 2, 64, 32),
};

static void test_kda(void **state)
{
	(void)state;
	check_plan(kda_cfg, NULL, "kda", kda, sizeof kda / sizeof kda[0], 2, 0);
	check_plan(kda_cfg, NULL, "kda", kda, sizeof kda / sizeof kda[0], 4, 0);
}

/* ---- qwen3-next: GDN with Hk = 4 key heads of 4, Hv = 8 value heads of 6; gated q ---- */

static const char *qwen3_next_cfg =
	"{\"model_type\": \"qwen3_next\", \"hidden_size\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"head_dim\": 8, \"attn_output_gate\": true, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8,"
	" \"linear_key_head_dim\": 4, \"linear_value_head_dim\": 6, \"moe_intermediate_size\": 16,"
	" \"shared_expert_intermediate_size\": 32, \"vocab_size\": 64}";

#define QL "model.layers.0.linear_attn."
static const want qwen3_next[] = {
	/* in_proj_qkvz: per key head [q 4 | k 4 | v 2x6 | z 2x6] = 32 features, 4 groups */
	{QL "in_proj_qkvz.weight", ST_BF16, 2, {128, 32}, 1, 0, 4, 32, 0, 1},
	{QL "in_proj_ba.weight", ST_BF16, 2, {16, 32}, 1, 0, 4, 4, 0, 1},
	{QL "A_log", ST_F32, 1, {8}, 1, 0, 8, 1, 0, 1},
	{QL "dt_bias", ST_F32, 1, {8}, 1, 0, 8, 1, 0, 1},
	REPL(QL "norm.weight", ST_BF16, 1, 6),
	{QL "out_proj.weight", ST_BF16, 2, {32, 48}, 1, 1, 8, 6, 0, 1},
	{"model.layers.3.self_attn.q_proj.weight", ST_BF16, 2, {64, 32}, 1, 0, 4, 16, 0, 1}, /* [q | gate] per head */
	{"model.layers.3.self_attn.k_proj.weight", ST_BF16, 2, {16, 32}, 1, 0, 2, 8, TP_GROUPS, 1},
	{"model.layers.3.mlp.shared_expert.gate_proj.weight", ST_BF16, 2, {32, 32}, 1, 0, 32, 1, 0, 1},
	REPL("mtp.fc.weight", ST_BF16, 2, 32, 64),
};

static void test_qwen3_next(void **state)
{
	(void)state;
	check_plan(qwen3_next_cfg, NULL, "qwen3-next", qwen3_next, sizeof qwen3_next / sizeof qwen3_next[0], 2, 0);
	/* the fused conv1d: three segments [Q 4x4 | K 4x4 | V 8x6], each split on its own */
	cJSON *cfg = cJSON_Parse(qwen3_next_cfg);
	tp_plan pl;
	tp_err e;
	char origin[256];
	assert_int_equal(tp_plan_choose(cfg, NULL, &pl, origin, sizeof origin, &e), 0);
	tp_expr_ctx cx = {.config = cfg};
	const want conv[] = {{QL "conv1d.weight", ST_BF16, 3, {80, 1, 4}, 1, 0, 0, 0, 0, 1}};
	load(conv, 1);
	tp_resolve_opts o = {.T = 2};
	tp_resolved res;
	assert_int_equal(tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "ckpt", &res, &e), 0);
	assert_int_equal(res.spec.kind, TP_SPLIT);
	assert_int_equal(res.spec.axis, 0);
	assert_int_equal(res.spec.nseg, 3);
	uint64_t units[] = {4, 4, 8}, width[] = {4, 4, 6};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(res.spec.seg[i], units[i]);
		assert_int_equal(res.spec.segu[i] ? res.spec.segu[i] : res.spec.unit, width[i]);
	}
	tp_plan_free(&pl);
	cJSON_Delete(cfg);
}

/* ---- generic (forced: --plan generic) ---- */

static const want generic[] = {
	{"model.embed_tokens.weight", ST_BF16, 2, {128, 48}, 1, 0, 128, 1, 0, 1},
	{"model.layers.0.attn.q_proj.weight", ST_BF16, 2, {48, 48}, 1, 0, 8, 6, 0, 1},
	{"model.layers.0.attn.k_proj.weight", ST_BF16, 2, {12, 48}, 1, 0, 2, 6, TP_GROUPS, 1},
	{"model.layers.0.attn.o_proj.weight", ST_BF16, 2, {48, 48}, 1, 1, 8, 6, 0, 1},
	{"model.layers.0.ffn.up_proj.weight", ST_BF16, 2, {96, 48}, 1, 0, 96, 1, 0, 1},
	{"model.layers.0.ffn.down_proj.weight", ST_BF16, 2, {48, 96}, 1, 1, 96, 1, 0, 1},
	REPL("model.layers.0.ffn.other.weight", ST_BF16, 2, 4, 4),
	{"model.layers.0.mlp.experts.3.down_proj.weight", ST_BF16, 2, {48, 32}, 1, 1, 32, 1, 0, 1}, /* per expert: fine */
};

static void test_generic(void **state)
{
	(void)state;
	const char *cfg = "{\"model_type\": \"mystery\", \"num_attention_heads\": 8, \"num_key_value_heads\": 2}";
	check_plan(cfg, "generic", "generic", generic, sizeof generic / sizeof generic[0], 2, 0);
	/* what a name cannot tell is refused by name, never replicated next to a split partner */
	const want refused[] = {
		{"model.layers.0.self_attn.qkv_proj.weight", ST_BF16, 2, {96, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.mlp.gate_up_proj.weight", ST_BF16, 2, {192, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.self_attn.W_pack.weight", ST_BF16, 2, {144, 48}, 0, 0, 0, 0, 0, 0},
		{"transformer.h.0.self_attention.query_key_value.weight", ST_BF16, 2, {144, 48}, 0, 0, 0, 0, 0, 0},
		{"transformer.h.0.attn.c_attn.weight", ST_BF16, 2, {48, 144}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.attention.wqkv.weight", ST_BF16, 2, {96, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.mlp.experts.gate_up_proj", ST_BF16, 3, {4, 48, 64}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.mlp.experts.gate_up_proj_bias", ST_BF16, 2, {4, 64}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.mlp.experts.down_proj", ST_BF16, 3, {4, 32, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.self_attn.sinks", ST_BF16, 1, {8}, 0, 0, 0, 0, 0, 0},
	};
	cJSON *c = cJSON_Parse(cfg);
	tp_plan pl;
	tp_err e;
	char origin[256];
	assert_int_equal(tp_plan_choose(c, "generic", &pl, origin, sizeof origin, &e), 0);
	tp_expr_ctx cx = {.config = c};
	load(refused, sizeof refused / sizeof refused[0]);
	tp_resolve_opts o = {.T = 2};
	for (size_t i = 0; i < ck.n; i++) {
		tp_resolved res;
		tp_err_clear(&e);
		int rc = tp_plan_resolve(&pl, &cx, &ck.t[i], lookup, &ck, &o, "ckpt", &res, &e);
		if (rc == 0 || e.code != TP_EPLAN || !strstr(e.msg, refused[i].name) || !strstr(e.msg, "refused by plan 'generic'") ||
		    !strstr(e.msg, "--plan FILE"))
			fail_msg("%s: rc %d: %s", refused[i].name, rc, e.msg);
	}
	tp_plan_free(&pl);
	cJSON_Delete(c);
}

/* ---- quantized companions: the same logical cut, in stored elements ---- */

static const char *fp8_cfg =
	"{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_attention_heads\": 2, \"num_key_value_heads\": 2,"
	" \"head_dim\": 128, \"intermediate_size\": 512, \"vocab_size\": 128,"
	" \"quantization_config\": {\"weight_block_size\": [128, 128]}}";

static const want fp8[] = {
	/* column: the weight's dim 0 in 512 features; the scale's dim 0 in blocks of 128 */
	{"model.layers.0.mlp.up_proj.weight", ST_F8_E4M3, 2, {512, 256}, 1, 0, 512, 1, 0, 1},
	{"model.layers.0.mlp.up_proj.weight_scale_inv", ST_F32, 2, {4, 2}, 1, 0, 512, 1, 0, 128},
	/* row: the last dims */
	{"model.layers.0.mlp.down_proj.weight", ST_F8_E4M3, 2, {256, 512}, 1, 1, 512, 1, 0, 1},
	{"model.layers.0.mlp.down_proj.weight_scale_inv", ST_F32, 2, {2, 4}, 1, 1, 512, 1, 0, 128},
	/* heads of 128: one block per head */
	{"model.layers.0.self_attn.o_proj.weight", ST_F8_E4M3, 2, {256, 256}, 1, 1, 2, 128, 0, 1},
	{"model.layers.0.self_attn.o_proj.weight_scale_inv", ST_F32, 2, {2, 2}, 1, 1, 2, 128, 0, 128},
	REPL("model.layers.0.self_attn.o_proj.input_scale", ST_F32, 0, 0),
};

static const char *nvfp4_cfg =
	"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
	" \"head_dim\": 16, \"intermediate_size\": 128, \"vocab_size\": 128}";

static const want nvfp4[] = {
	/* packed FP4: two values per byte along K; F8 group scales of 16 (NVFP4's default) */
	{"model.layers.0.mlp.down_proj.weight", ST_U8, 2, {64, 64}, 1, 1, 128, 1, 0, 2},
	{"model.layers.0.mlp.down_proj.weight_scale", ST_F8_E4M3, 2, {64, 8}, 1, 1, 128, 1, 0, 16},
	REPL("model.layers.0.mlp.down_proj.weight_scale_2", ST_F32, 0, 0),
	REPL("model.layers.0.mlp.down_proj.input_scale", ST_F32, 1, 1),
	/* column: dim 0 is not packed */
	{"model.layers.0.mlp.gate_proj.weight", ST_U8, 2, {128, 32}, 1, 0, 128, 1, 0, 1},
	{"model.layers.0.mlp.gate_proj.weight_scale", ST_F8_E4M3, 2, {128, 4}, 1, 0, 128, 1, 0, 1},
	/* a per-channel scale [N, 1] under a row split is a broadcast */
	{"model.layers.0.self_attn.o_proj.weight", ST_BF16, 2, {64, 64}, 1, 1, 4, 16, 0, 1},
	REPL("model.layers.0.self_attn.o_proj.weight_scale", ST_F32, 2, 64, 1),
};

static void test_quantized(void **state)
{
	(void)state;
	check_plan(fp8_cfg, NULL, "llama", fp8, sizeof fp8 / sizeof fp8[0], 2, 0);
	check_plan(nvfp4_cfg, NULL, "llama", nvfp4, sizeof nvfp4 / sizeof nvfp4[0], 2, 0);
	/* a group size from config.json wins over NVFP4's 16 */
	const char *g32 = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 16,"
			  " \"intermediate_size\": 128, \"vocab_size\": 128, \"quantization_config\": {\"group_size\": 32}}";
	const want w32[] = {
		{"model.layers.0.mlp.down_proj.weight", ST_U8, 2, {64, 64}, 1, 1, 128, 1, 0, 2},
		{"model.layers.0.mlp.down_proj.weight_scale", ST_F8_E4M3, 2, {64, 4}, 1, 1, 128, 1, 0, 32},
	};
	check_plan(g32, NULL, "llama", w32, 2, 2, 0);
}

/* ---- vocabulary: refused when it does not divide, padded with pad_vocab ---- */

static void test_vocab(void **state)
{
	(void)state;
	const char *cfg = "{\"model_type\": \"llama\", \"vocab_size\": 100}";
	const want v[] = {{"lm_head.weight", ST_BF16, 2, {100, 8}, 1, 0, 100, 1, 0, 1}};
	check_plan(cfg, NULL, "llama", v, 1, 4, 0);
	check_plan(cfg, NULL, "llama", v, 1, 8, 64); /* padded to 128 rows: 16 per rank */
	cJSON *c = cJSON_Parse(cfg);
	tp_plan pl;
	tp_err e;
	char origin[256];
	assert_int_equal(tp_plan_choose(c, NULL, &pl, origin, sizeof origin, &e), 0);
	tp_expr_ctx cx = {.config = c};
	load(v, 1);
	tp_resolve_opts o = {.T = 8};
	tp_resolved res;
	assert_int_equal(tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "ckpt", &res, &e), -1);
	assert_int_equal(e.code, TP_EPLAN);
	assert_non_null(strstr(e.msg, "the vocabulary of 100 rows does not divide over 8 ranks; pass --pad-vocab"));
	tp_plan_free(&pl);
	cJSON_Delete(c);
}

/* ---- split kinds, plan-file errors ---- */

static int parse(const char *text, tp_plan *pl, tp_err *e)
{
	return tp_plan_parse(text, strlen(text), "test.json", pl, e);
}

static void test_kinds(void **state)
{
	(void)state;
	/* the table lists each kind once, and parsing knows every name in it */
	for (int k = 0; k < PL_NKINDS; k++) {
		const tp_split_kind_def *d = tp_split_kind(k);
		assert_non_null(d);
		assert_int_equal(tp_split_kind_find(d->name), k);
		char text[512];
		snprintf(text, sizeof text,
			 "{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"%s\", \"axis\": 0, \"heads\": 2,"
			 " \"reason\": \"r\"}]}",
			 d->name);
		tp_plan pl;
		tp_err e;
		if (parse(text, &pl, &e) < 0)
			fail_msg("kind %s: %s", d->name, e.msg);
		assert_int_equal(pl.rules[0].split, k);
		tp_plan_free(&pl);
	}
	assert_null(tp_split_kind(PL_NKINDS));
	assert_int_equal(tp_split_kind_find("sideways"), -1);
	tp_plan pl;
	tp_err e;
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"sideways\"}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "'split' must be one of replicate, column, row, axis, heads_axis"));
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"axis\"}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "split 'axis' needs an integer 'axis'"));
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"axis\", \"axis\": 1e300}]}", &pl, &e), -1);
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"heads_axis\"}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "split 'heads_axis' needs 'heads'"));
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"row\", \"heads\": 1e300}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "'heads' must be an integer"));
}

/* Resolves one tensor under a one-rule plan; returns rc and the error. */
static int resolve_one(const char *rule, const char *config, const want *w, tp_err *e)
{
	char text[1024];
	snprintf(text, sizeof text, "{\"tpfs_plan\": 1, \"name\": \"mine\", \"rules\": [%s]}", rule);
	tp_plan pl;
	if (parse(text, &pl, e) < 0)
		fail_msg("%s", e->msg);
	cJSON *c = cJSON_Parse(config);
	tp_expr_ctx cx = {.config = c};
	load(w, 1);
	tp_resolve_opts o = {.T = 2};
	tp_resolved res;
	tp_err_clear(e);
	int rc = tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "f.safetensors", &res, e);
	tp_plan_free(&pl);
	cJSON_Delete(c);
	return rc;
}

static void test_rule_errors(void **state)
{
	(void)state;
	const want a_log[] = {{"model.layers.0.self_attn.A_log", ST_F32, 1, {4}, 1, 0, 4, 1, 0, 1}};
	tp_err e;
	/* a key config.json lacks: the plan's error, naming plan, rule, field, expression and key */
	assert_int_equal(resolve_one("{\"name\": \"kda_a_log\", \"match\": \"**.A_log\", \"split\": \"heads_axis\","
				     " \"heads\": \"linear_attn_config.num_heads\"}", "{}", a_log, &e), -1);
	assert_int_equal(e.code, TP_ERULE);
	assert_non_null(strstr(e.msg, "f.safetensors: tensor 'model.layers.0.self_attn.A_log': plan 'mine', rule 'kda_a_log' (heads): "
				      "expression 'linear_attn_config.num_heads': key 'linear_attn_config.num_heads' is missing from config.json"));
	/* a hostile expression: an error, not a crash */
	assert_int_equal(resolve_one("{\"name\": \"r\", \"match\": \"**.A_log\", \"split\": \"column\","
				     " \"heads\": \"(-9223372036854775807 - 1) % -1\"}", "{}", a_log, &e), -1);
	assert_int_equal(e.code, TP_ERULE);
	assert_non_null(strstr(e.msg, "remainder overflows"));
	/* when: short-circuit, and its errors are the plan's too */
	assert_int_equal(resolve_one("{\"name\": \"r\", \"match\": \"**.A_log\", \"when\": \"has(foo) && foo > 3\", \"split\": \"column\"}",
				     "{}", a_log, &e), 0);
	assert_int_equal(resolve_one("{\"name\": \"r\", \"match\": \"**.A_log\", \"when\": \"foo / 0\", \"split\": \"column\"}",
				     "{\"foo\": 1}", a_log, &e), -1);
	assert_int_equal(e.code, TP_ERULE);
	assert_non_null(strstr(e.msg, "plan 'mine', rule 'r' (when): expression 'foo / 0': division by zero"));
	/* a non-positive head count is the plan's error */
	assert_int_equal(resolve_one("{\"name\": \"r\", \"match\": \"**.A_log\", \"split\": \"column\", \"heads\": \"n\"}",
				     "{\"n\": 0}", a_log, &e), -1);
	assert_int_equal(e.code, TP_ERULE);
	/* a tensor the rule cannot cut is not: TP_EPLAN, naming the tensor, the numbers, the keys */
	assert_int_equal(resolve_one("{\"name\": \"r\", \"match\": \"**.A_log\", \"split\": \"column\", \"heads\": \"n\"}",
				     "{\"n\": 3}", a_log, &e), -1);
	assert_int_equal(e.code, TP_EPLAN);
	assert_non_null(strstr(e.msg, "tensor 'model.layers.0.self_attn.A_log' (rule 'r'): axis 0 of 'model.layers.0.self_attn.A_log' "
				      "holds 4 features, not a multiple of 3 heads ('n'; n=3)"));
	assert_int_equal(resolve_one("{\"name\": \"r\", \"match\": \"**.A_log\", \"split\": \"heads_axis\", \"heads\": \"5\"}",
				     "{}", a_log, &e), -1);
	assert_int_equal(e.code, TP_EPLAN);
	assert_non_null(strstr(e.msg, "no axis has size 5 (heads)"));
}

/* A rule's "when" sees DP, the data-parallel ranks (--dp; 1 without): the deepseek_v3 view keeps the shared
 * experts whole where vLLM's MoE is sequence-parallel (DP > 1 && T > 1) and leaves them to the next rule
 * elsewhere. */
static void test_when_dp(void **state)
{
	(void)state;
	const char *text = "{\"tpfs_plan\": 1, \"name\": \"dp\", \"rules\": ["
			   "{\"name\": \"sp\", \"match\": \"**.shared_experts.up_proj\", \"when\": \"DP > 1 && T > 1\","
			   " \"split\": \"replicate\"},"
			   "{\"name\": \"col\", \"match\": \"**.shared_experts.up_proj\", \"split\": \"column\"}]}";
	tp_plan pl;
	tp_err e;
	assert_int_equal(parse(text, &pl, &e), 0);
	cJSON *c = cJSON_Parse("{}");
	const want w[] = {{"m.shared_experts.up_proj.weight", ST_BF16, 2, {8, 4}, 1, 0, 8, 1, 0, 1}};
	load(w, 1);
	const uint32_t T[] = {2, 2, 2, 1};
	const uint32_t D[] = {0, 1, 2, 2};
	const int want_rule[] = {1, 1, 0, 1};
	for (int k = 0; k < 4; k++) {
		tp_expr_ctx cx = {.config = c};
		tp_resolve_opts o = {.T = T[k], .D = D[k]};
		tp_resolved res;
		tp_err_clear(&e);
		if (tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "f.safetensors", &res, &e) < 0)
			fail_msg("T=%u D=%u: %s", T[k], D[k], e.msg);
		assert_int_equal(res.rule, want_rule[k]);
		assert_int_equal(res.spec.kind, want_rule[k] ? TP_SPLIT : TP_REPLICATE);
	}
	tp_plan_free(&pl);
	cJSON_Delete(c);
}

/* heads_axis with "axis": the preferred axis where it has the size of 'heads' (Qwen3-VL-MoE's fused experts,
 * [E, 2I, D] as save_pretrained writes them or [E, D, 2I] as published, ambiguous when D == 2I: the model
 * code's own layout wins), otherwise the one other axis of that size; without it, two candidates are refused. */
static int resolved_axis(const char *rule, const want *w, uint32_t *axis, tp_err *e)
{
	char text[1024];
	snprintf(text, sizeof text, "{\"tpfs_plan\": 1, \"name\": \"mine\", \"rules\": [%s]}", rule);
	tp_plan pl;
	if (parse(text, &pl, e) < 0)
		fail_msg("%s", e->msg);
	cJSON *c = cJSON_Parse("{\"I\": 6}");
	tp_expr_ctx cx = {.config = c};
	load(w, 1);
	tp_resolve_opts o = {.T = 2};
	tp_resolved res;
	tp_err_clear(e);
	int rc = tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "f.safetensors", &res, e);
	if (rc == 0)
		*axis = res.spec.axis;
	tp_plan_free(&pl);
	cJSON_Delete(c);
	return rc;
}

static void test_heads_axis_preferred(void **state)
{
	(void)state;
	const char *pref = "{\"name\": \"gu\", \"match\": \"**.experts.gate_up_proj\", \"split\": \"heads_axis\","
			   " \"heads\": \"2 * I\", \"axis\": 1, \"segments\": [\"I\", \"I\"]}";
	const char *plain = "{\"name\": \"gu\", \"match\": \"**.experts.gate_up_proj\", \"split\": \"heads_axis\","
			    " \"heads\": \"2 * I\", \"segments\": [\"I\", \"I\"]}";
	const want saved[] = {{"m.experts.gate_up_proj", ST_BF16, 3, {4, 12, 8}, 1, 1, 12, 1, 0, 1}};
	const want published[] = {{"m.experts.gate_up_proj", ST_BF16, 3, {4, 8, 12}, 1, 2, 12, 1, 0, 1}};
	const want square[] = {{"m.experts.gate_up_proj", ST_BF16, 3, {4, 12, 12}, 1, 1, 12, 1, 0, 1}};
	const want neither[] = {{"m.experts.gate_up_proj", ST_BF16, 3, {4, 8, 10}, 1, 1, 12, 1, 0, 1}};
	tp_err e;
	uint32_t ax = 99;
	assert_int_equal(resolved_axis(pref, saved, &ax, &e), 0);
	assert_int_equal(ax, 1);
	assert_int_equal(resolved_axis(pref, published, &ax, &e), 0);
	assert_int_equal(ax, 2);
	assert_int_equal(resolved_axis(pref, square, &ax, &e), 0);
	assert_int_equal(ax, 1);
	assert_int_equal(resolved_axis(plain, square, &ax, &e), -1);
	assert_non_null(strstr(e.msg, "more than one axis has size 12 (heads)"));
	assert_int_equal(resolved_axis(pref, neither, &ax, &e), -1);
	assert_non_null(strstr(e.msg, "no axis has size 12 (heads)"));
	tp_plan pl;
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"k\", \"rules\": [{\"match\": \"x\", \"split\": \"heads_axis\","
			       " \"heads\": \"2\", \"axis\": 0.5}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "'axis' of split 'heads_axis' must be an integer"));
}

/* A tensor named like the module (a fused experts tensor [E, ...]) is the reference of the module's
 * role companions: in a quantized checkpoint a scale [E, 8] of a row-split [E, 6, 16] covers 2 of the
 * 16 features per element; in an unquantized one that ratio is no known layout, and it is refused by
 * name (T5Gemma2's embed_tokens.eoi_embedding [hidden] beside [vocab, hidden] was cut as if packed). */
static void test_bare_reference(void **state)
{
	(void)state;
	const char *text = "{\"tpfs_plan\": 1, \"name\": \"bare\", \"rules\": [{\"name\": \"e\", \"match\": \"**.experts.w\","
			   " \"split\": \"row\", \"size\": \"16\"}]}";
	tp_plan pl;
	tp_err e;
	assert_int_equal(parse(text, &pl, &e), 0);
	const want w[] = {
		{"m.experts.w", ST_BF16, 3, {4, 6, 16}, 1, 2, 16, 1, 0, 1},
		{"m.experts.w.scale", ST_BF16, 2, {4, 8}, 1, 1, 16, 1, 0, 2},
		{"m.experts.w.bias", ST_BF16, 1, {16}, 0, 0, 0, 0, 0, 0}, /* row-parallel bias: whole */
	};
	load(w, 3);
	tp_expr_ctx bare = {.config = NULL};
	tp_resolve_opts o = {.T = 2};
	tp_resolved r0;
	assert_int_equal(tp_plan_resolve(&pl, &bare, &ck.t[1], lookup, &ck, &o, "ckpt", &r0, &e), -1);
	assert_non_null(strstr(e.msg, "m.experts.w.scale"));
	assert_non_null(strstr(e.msg, "is not quantized"));
	cJSON *q = cJSON_Parse("{\"quantization_config\": {\"quant_method\": \"fp8\"}}");
	tp_expr_ctx cx = {.config = q};
	for (size_t i = 0; i < 3; i++) {
		tp_resolved res;
		if (tp_plan_resolve(&pl, &cx, &ck.t[i], lookup, &ck, &o, "ckpt", &res, &e) < 0)
			fail_msg("%s: %s", w[i].name, e.msg);
		if (!w[i].split) {
			assert_int_equal(res.spec.kind, TP_REPLICATE);
			continue;
		}
		if (res.spec.kind != TP_SPLIT || res.spec.axis != w[i].axis || res.spec.seg[0] != w[i].units || res.spec.div != w[i].div)
			fail_msg("%s: %s", w[i].name, res.why);
	}
	cJSON_Delete(q);
	tp_plan_free(&pl);
}

/* ---- plan choice ---- */

static void test_choice(void **state)
{
	(void)state;
	static const struct {
		const char *config, *plan;
	} cases[] = {
		{"{\"model_type\": \"qwen2\"}", "llama"},
		{"{\"architectures\": [\"MistralForCausalLM\"]}", "llama"},
		{"{\"model_type\": \"qwen2_moe\"}", "qwen-moe"},
		{"{\"model_type\": \"kimi_k2\"}", "deepseek"},
		{"{\"model_type\": \"glm_moe_dsa\"}", "deepseek"},
		{"{\"model_type\": \"kimi_linear\"}", "kda"},
		{"{\"model_type\": \"glm5_next\", \"text_config\": {\"model_type\": \"glm5_next_text\"}}", "kda"},
		{"{\"model_type\": \"wrapper\", \"text_config\": {\"model_type\": \"qwen3_5_moe_text\"}}", "qwen3-next"},
		/* the model_type wins over an architecture another plan lists */
		{"{\"model_type\": \"phi3\", \"architectures\": [\"LlamaForCausalLM\"]}", "phi3"},
		{"{\"model_type\": \"mixtral\", \"architectures\": [\"LlamaForCausalLM\"]}", "mixtral"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		cJSON *c = cJSON_Parse(cases[i].config);
		tp_plan pl;
		tp_err e;
		char origin[256];
		if (tp_plan_choose(c, NULL, &pl, origin, sizeof origin, &e) != 0)
			fail_msg("%s: %s", cases[i].config, e.msg);
		if (strcmp(pl.name, cases[i].plan))
			fail_msg("%s: chose %s, want %s", cases[i].config, pl.name, cases[i].plan);
		assert_non_null(strstr(origin, "detected from config.json"));
		tp_plan_free(&pl);
		cJSON_Delete(c);
	}
	/* extends: a built-in's rules follow the plan's own */
	tp_plan pl;
	tp_err e;
	char origin[256];
	assert_int_equal(tp_plan_choose(NULL, "kda", &pl, origin, sizeof origin, &e), 0);
	assert_string_equal(pl.rules[0].name, "vision");
	int has_mla = 0, has_q = 0;
	for (int i = 0; i < pl.nrules; i++) {
		has_mla |= !strcmp(pl.rules[i].name, "mla_q_b");
		has_q |= !strcmp(pl.rules[i].name, "q_proj");
	}
	assert_true(has_mla && has_q);
	tp_plan_free(&pl);
	/* no silent guesses: an architecture no built-in knows is refused, saying how to proceed */
	static const struct {
		const char *config, *names;
	} unknown[] = {
		{"{\"model_type\": \"mystery\", \"architectures\": [\"MysteryForCausalLM\"]}", "model_type 'mystery'"},
		{"{\"model_type\": \"wrap\", \"text_config\": {\"model_type\": \"inner\"}}", "model_type 'wrap' (text_config: 'inner')"},
		{"{\"hidden_size\": 8}", "a config.json without model_type"},
		{NULL, "a checkpoint without config.json"},
	};
	for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
		cJSON *c = unknown[i].config ? cJSON_Parse(unknown[i].config) : NULL;
		assert_int_equal(tp_plan_choose(c, NULL, &pl, origin, sizeof origin, &e), -1);
		char want[256];
		snprintf(want, sizeof want, "no built-in plan knows %s (built-in plans: aria, bailing-hybrid, beam, cohere2-moe, cosmos3-edge, deepseek-v4, deepseek, dots3, ernie4_5-moe, exaone-moe, flint, generic, ", unknown[i].names);
		if (!strstr(e.msg, want) || !strstr(e.msg, "; 'tpfs plan --list' shows the model types each detects") ||
		    !strstr(e.msg, "give a plan file with --plan FILE") || !strstr(e.msg, "accept the generic name-based guess with --plan generic"))
			fail_msg("%s: %s", unknown[i].names, e.msg);
		cJSON_Delete(c);
	}
	assert_int_equal(tp_plan_choose(NULL, "nosuch", &pl, origin, sizeof origin, &e), -1);
	assert_non_null(strstr(e.msg, "--plan nosuch: no such built-in plan (built-in: aria, bailing-hybrid, beam, cohere2-moe, cosmos3-edge, deepseek-v4, deepseek, dots3, "
				   "ernie4_5-moe, exaone-moe, flint, generic, glm4v-moe, glm4v, gpt-oss, granitemoe, hunyuan-moe, "
				   "hunyuan-vl, hy-v4, jamba, kda, kolibri1, laguna, lfm, llama, llama4, longcat, mamba2, mimo-v2, "
				   "minimax-m3, mistral-large4, mixtral, olmo-hybrid, olmoe, phi3, qwen-moe, qwen3-next, "
				   "qwen3-vl-moe, sarvam-moe, step3p5"));
}

/* tp_model_open on a missing folder fails cleanly (the ASan build's leak check covers m->src) */
static void test_model_open_missing(void **state)
{
	(void)state;
	tp_model m;
	tp_model_opts o = {.src = "/nonexistent/tpfs-test-folder", .T = 2};
	tp_err e;
	assert_int_equal(tp_model_open(&m, &o, &e), -1);
	assert_non_null(strstr(e.msg, "/nonexistent/tpfs-test-folder: No such file or directory"));
	assert_null(m.src);
}

/* ---- expert parallelism: the experts declarations ---- */

/* Resolves every tensor of w with plan pl under --ep at T; returns the first failure's code
 * (TP_OK when all resolve) with res[i] filled in. */
static tp_code resolve_ep(const tp_plan *pl, const char *config, const want *w, size_t n, uint32_t T,
			  tp_resolved *res, tp_err *e)
{
	cJSON *c = cJSON_Parse(config);
	assert_non_null(c);
	tp_expr_ctx cx = {.config = c};
	load(w, n);
	tp_resolve_opts o = {.T = T, .ep = 1};
	tp_code code = TP_OK;
	for (size_t i = 0; i < n && code == TP_OK; i++)
		if (tp_plan_resolve(pl, &cx, &ck.t[i], lookup, &ck, &o, "f.safetensors", &res[i], e) < 0)
			code = e->code;
	cJSON_Delete(c);
	return code;
}

/* Under --ep the built-in MoE plans place routed experts whole: a tensor of expert e (weight,
 * FP8 block scale) is owned by unit e of E; a fused [E, ...] tensor and its [E, ...] companions
 * are split on the expert axis in E units of 1; everything else (attention, shared experts,
 * router, dense MLP) resolves exactly as without --ep (compared with the spec resolved without
 * it, and with the rules: q_proj in heads, the shared expert column-parallel). */
static void test_ep_resolve(void **state)
{
	(void)state;
	const char *qcfg = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 48, \"num_attention_heads\": 8,"
			   " \"num_key_value_heads\": 4, \"head_dim\": 6, \"moe_intermediate_size\": 32,"
			   " \"shared_expert_intermediate_size\": 64, \"intermediate_size\": 96, \"num_experts\": 4}";
	const want q[] = {
		{"model.layers.1.mlp.experts.3.gate_proj.weight", ST_BF16, 2, {32, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.mlp.experts.0.down_proj.weight", ST_BF16, 2, {48, 32}, 0, 0, 0, 0, 0, 0},
		{"model.layers.2.mlp.experts.gate_up_proj", ST_BF16, 3, {4, 64, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.2.mlp.experts.down_proj", ST_BF16, 3, {4, 48, 32}, 0, 0, 0, 0, 0, 0},
		{"model.layers.2.mlp.experts.gate_up_proj_bias", ST_BF16, 2, {4, 64}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.self_attn.q_proj.weight", ST_BF16, 2, {48, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.mlp.shared_expert.gate_proj.weight", ST_BF16, 2, {64, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.mlp.gate.weight", ST_BF16, 2, {4, 48}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.mlp.up_proj.weight", ST_BF16, 2, {96, 48}, 0, 0, 0, 0, 0, 0},
	};
	size_t n = sizeof q / sizeof q[0];
	cJSON *cfg = cJSON_Parse(qcfg);
	tp_plan pl;
	tp_err e;
	char origin[256];
	assert_int_equal(tp_plan_choose(cfg, NULL, &pl, origin, sizeof origin, &e), 0);
	assert_true(pl.nexperts >= 1);
	tp_resolved res[16], tp[16];
	if (resolve_ep(&pl, qcfg, q, n, 2, res, &e) != TP_OK)
		fail_msg("--ep: %s", e.msg);
	/* expert 3 and expert 0: owned, whole */
	assert_int_equal(res[0].spec.kind, TP_OWNED);
	assert_int_equal(res[0].spec.seg[0], 4);
	assert_int_equal(res[0].spec.owner, 3);
	assert_int_equal(res[0].spec.flags, TP_EXPERT);
	assert_int_equal(res[0].rule, TP_RULE_EXPERTS);
	assert_int_equal(res[1].spec.kind, TP_OWNED);
	assert_int_equal(res[1].spec.owner, 0);
	/* fused: the expert axis in 4 units of 1 */
	for (int i = 2; i <= 4; i++) {
		assert_int_equal(res[i].spec.kind, TP_SPLIT);
		assert_int_equal(res[i].spec.axis, 0);
		assert_int_equal(res[i].spec.nseg, 1);
		assert_int_equal(res[i].spec.seg[0], 4);
		assert_int_equal(res[i].spec.unit, 1);
		assert_int_equal(res[i].spec.div, 1);
		assert_int_equal(res[i].spec.flags, TP_EXPERT);
	}
	/* the rest as without --ep */
	load(q, n);
	tp_expr_ctx cx = {.config = cfg};
	tp_resolve_opts o = {.T = 2};
	for (size_t i = 5; i < n; i++) {
		assert_int_equal(tp_plan_resolve(&pl, &cx, &ck.t[i], lookup, &ck, &o, "f.safetensors", &tp[i], &e), 0);
		assert_memory_equal(&res[i].spec, &tp[i].spec, sizeof tp[i].spec);
		assert_int_equal(res[i].rule, tp[i].rule);
		assert_int_equal(res[i].experts, -1);
	}
	assert_int_equal(res[5].spec.kind, TP_SPLIT); /* q_proj: 8 heads of 6 */
	assert_int_equal(res[5].spec.seg[0], 8);
	assert_int_equal(res[5].spec.unit, 6);
	assert_int_equal(res[6].spec.kind, TP_SPLIT); /* the shared expert stays tensor-parallel */
	assert_int_equal(res[6].spec.seg[0], 64);
	assert_int_equal(res[7].spec.kind, TP_REPLICATE);
	/* without --ep, an expert is cut on its intermediate size and flagged (refusals suggest --ep) */
	load(q, n);
	assert_int_equal(tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "f.safetensors", &tp[0], &e), 0);
	assert_int_equal(tp[0].spec.kind, TP_SPLIT);
	assert_int_equal(tp[0].spec.seg[0], 32);
	assert_int_equal(tp[0].spec.flags, TP_EXPERT);
	assert_int_equal(tp[0].experts, 0);

	/* refusals: a fused tensor whose expert axis is not E, an expert index past E */
	const want bad1[] = {{"model.layers.2.mlp.experts.down_proj", ST_BF16, 3, {6, 48, 32}, 0, 0, 0, 0, 0, 0}};
	assert_int_equal(resolve_ep(&pl, qcfg, bad1, 1, 2, res, &e), TP_EPLAN);
	assert_non_null(strstr(e.msg, "tensor 'model.layers.2.mlp.experts.down_proj' (experts 'routed'): axis 0 holds 6 experts "
				      "but 'first(num_experts, num_local_experts)' = 4 (num_experts=4)"));
	const want bad2[] = {{"model.layers.1.mlp.experts.4.up_proj.weight", ST_BF16, 2, {32, 48}, 0, 0, 0, 0, 0, 0}};
	assert_int_equal(resolve_ep(&pl, qcfg, bad2, 1, 2, res, &e), TP_EPLAN);
	assert_non_null(strstr(e.msg, "expert 4, but 'first(num_experts, num_local_experts)' = 4 routed experts (num_experts=4)"));

	/* the model-level check: E over T, naming E and the T that work */
	cx.nprefix = 0;
	int64_t E[TP_MAX_EXPERT_DECLS];
	assert_int_equal(tp_plan_ep_check(&pl, &cx, 2, 0, E, &e), 0);
	assert_int_equal(E[0], 4);
	assert_int_equal(tp_plan_ep_check(&pl, &cx, 3, 0, E, &e), -1);
	assert_int_equal(e.code, TP_EPLAN);
	assert_non_null(strstr(e.msg, "--ep: 4 routed experts (num_experts=4; plan 'qwen-moe', experts 'routed') do not divide "
				      "over 3 ranks: rank r holds experts [r*E/N, (r+1)*E/N), so N must divide 4: --tp 1, 2, 4"));
	tp_plan_free(&pl);
	cJSON_Delete(cfg);
	/* E = 256 at T = 3: every divisor up to 1024 is offered */
	cfg = cJSON_Parse("{\"model_type\": \"deepseek_v3\", \"n_routed_experts\": 256}");
	assert_int_equal(tp_plan_choose(cfg, NULL, &pl, origin, sizeof origin, &e), 0);
	cx.config = cfg;
	assert_int_equal(tp_plan_ep_check(&pl, &cx, 3, 0, E, &e), -1);
	assert_non_null(strstr(e.msg, "256 routed experts (n_routed_experts=256; plan 'deepseek'"));
	assert_non_null(strstr(e.msg, "--tp 1, 2, 4, 8, 16, 32, 64, 128, 256"));
	/* a count config.json cannot give: no placement, and an expert tensor is the plan's error */
	cJSON_Delete(cfg);
	cfg = cJSON_Parse("{\"model_type\": \"deepseek_v3\"}");
	cx.config = cfg;
	assert_int_equal(tp_plan_ep_check(&pl, &cx, 2, 0, E, &e), 0);
	assert_int_equal(E[0], 0);
	const want un[] = {{"model.layers.1.mlp.experts.5.gate_proj.weight", ST_BF16, 2, {24, 32}, 0, 0, 0, 0, 0, 0}};
	assert_int_equal(resolve_ep(&pl, "{}", un, 1, 2, res, &e), TP_ERULE);
	assert_non_null(strstr(e.msg, "tensor 'model.layers.1.mlp.experts.5.gate_proj.weight': plan 'deepseek', experts 'routed' (count): "
				      "expression 'first(n_routed_experts, num_local_experts, num_experts)' is missing from config.json"));
	/* FP8: an expert's block scale travels with it */
	const char *dcfg = "{\"model_type\": \"deepseek_v3\", \"n_routed_experts\": 8, \"moe_intermediate_size\": 256,"
			   " \"hidden_size\": 256, \"quantization_config\": {\"weight_block_size\": [128, 128]}}";
	const want d[] = {
		{"model.layers.1.mlp.experts.5.gate_proj.weight", ST_F8_E4M3, 2, {256, 256}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.mlp.experts.5.gate_proj.weight_scale_inv", ST_F32, 2, {2, 2}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.mlp.shared_experts.gate_proj.weight_scale_inv", ST_F32, 2, {2, 2}, 0, 0, 0, 0, 0, 0},
		{"model.layers.1.mlp.shared_experts.gate_proj.weight", ST_F8_E4M3, 2, {256, 256}, 0, 0, 0, 0, 0, 0},
	};
	if (resolve_ep(&pl, dcfg, d, 4, 4, res, &e) != TP_OK)
		fail_msg("--ep deepseek: %s", e.msg);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(res[i].spec.kind, TP_OWNED);
		assert_int_equal(res[i].spec.seg[0], 8);
		assert_int_equal(res[i].spec.owner, 5);
	}
	assert_int_equal(res[2].spec.kind, TP_SPLIT); /* shared experts: block scale cut with the weight */
	assert_int_equal(res[2].spec.div, 128);
	tp_plan_free(&pl);
	cJSON_Delete(cfg);
	/* a plan without experts declarations cannot serve --ep */
	cfg = cJSON_Parse("{\"model_type\": \"llama\"}");
	assert_int_equal(tp_plan_choose(cfg, NULL, &pl, origin, sizeof origin, &e), 0);
	cx.config = cfg;
	assert_int_equal(tp_plan_ep_check(&pl, &cx, 2, 0, E, &e), -1);
	assert_non_null(strstr(e.msg, "--ep: plan 'llama' declares no routed experts"));
	tp_plan_free(&pl);
	cJSON_Delete(cfg);
}

/* Experts declarations in plan files: fields checked, a user plan's declarations come before
 * those of the built-in it extends, an axis from the end. */
static void test_ep_declarations(void **state)
{
	(void)state;
	tp_plan pl;
	tp_err e;
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"x\", \"rules\": [], \"experts\": [{\"match\": \"a.{e}.**\"}]}",
			       &pl, &e), -1);
	assert_non_null(strstr(e.msg, "test.json: experts '#0': 'count' (the number of routed experts, an expression) is required"));
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"x\", \"rules\": [], \"experts\": [{\"count\": 4}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "'match' (a pattern or a list of patterns) is required"));
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"x\", \"rules\": [], \"experts\": [{\"match\": \"a\", \"count\": 4,"
			       " \"size\": 3}]}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "unknown field 'size'"));
	assert_int_equal(parse("{\"tpfs_plan\": 1, \"name\": \"x\", \"rules\": [], \"experts\": {}}", &pl, &e), -1);
	assert_non_null(strstr(e.msg, "\"experts\" must be a list"));
	/* a user plan over qwen-moe: its own declaration first (last axis: [.., E]), then the base's */
	char path[] = "/tmp/tpfs-test-plan-XXXXXX.json";
	int fd = mkstemps(path, 5);
	assert_true(fd >= 0);
	const char *text = "{\"tpfs_plan\": 1, \"name\": \"mine\", \"extends\": \"qwen-moe\", \"rules\": [],"
			   " \"experts\": [{\"name\": \"packed\", \"match\": \"**.moe.w_all\", \"count\": \"num_experts\", \"axis\": -1}]}";
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	char origin[256];
	assert_int_equal(tp_plan_choose(NULL, path, &pl, origin, sizeof origin, &e), 0);
	unlink(path);
	assert_int_equal(pl.nexperts, 2);
	assert_string_equal(pl.experts[0].name, "packed");
	assert_string_equal(pl.experts[1].name, "routed");
	const want w[] = {
		{"model.layers.0.moe.w_all", ST_BF16, 3, {2, 6, 4}, 0, 0, 0, 0, 0, 0},
		{"model.layers.0.mlp.experts.1.up_proj.weight", ST_BF16, 2, {2, 6}, 0, 0, 0, 0, 0, 0},
	};
	tp_resolved res[2];
	if (resolve_ep(&pl, "{\"num_experts\": 4}", w, 2, 2, res, &e) != TP_OK)
		fail_msg("%s", e.msg);
	assert_int_equal(res[0].spec.kind, TP_SPLIT);
	assert_int_equal(res[0].spec.axis, 2);
	assert_int_equal(res[0].experts, 0);
	assert_int_equal(res[1].spec.kind, TP_OWNED);
	assert_int_equal(res[1].experts, 1);
	tp_plan_free(&pl);
}

/* Every built-in MoE plan declares its routed experts, in the names and config keys of its
 * checkpoints: under --ep a per-expert tensor is owned by its expert, a fused [E, ...] tensor is
 * split on axis 0 in E units; the shared experts stay tensor-parallel. */
static void test_ep_builtins(void **state)
{
	(void)state;
	static const struct {
		const char *plan, *config, *name;
		st_dtype dt;
		uint32_t ndim;
		uint64_t shape[4];
		int owned; /* 1: owned by expert `owner`; 0: split on axis 0 in E units */
		uint64_t E, owner;
	} cases[] = {
		{"qwen-moe", "{\"num_local_experts\": 8}", "model.layers.3.mlp.experts.7.down_proj.weight", ST_BF16, 2, {32, 16}, 1, 8, 7},
		{"qwen3-next", "{\"num_experts\": 8}", "model.layers.3.mlp.experts.2.up_proj.weight", ST_BF16, 2, {16, 32}, 1, 8, 2},
		{"deepseek", "{\"n_routed_experts\": 16}", "model.layers.3.mlp.experts.9.gate_proj.weight_scale_inv", ST_F32, 2, {1, 1}, 1, 16, 9},
		{"kda", "{\"num_experts\": 4}", "model.layers.1.block_sparse_moe.experts.3.w2.weight", ST_BF16, 2, {32, 16}, 1, 4, 3},
		{"mixtral", "{\"num_local_experts\": 8}", "model.layers.0.block_sparse_moe.experts.5.w1.weight", ST_BF16, 2, {16, 32}, 1, 8, 5},
		{"ernie4_5-moe", "{\"moe_num_experts\": 8}", "model.layers.1.mlp.experts.6.gate_proj.weight", ST_BF16, 2, {16, 32}, 1, 8, 6},
		{"gpt-oss", "{\"num_local_experts\": 4}", "model.layers.0.mlp.experts.gate_up_proj", ST_BF16, 3, {4, 32, 32}, 0, 4, 0},
		{"gpt-oss", "{\"num_local_experts\": 4}", "model.layers.0.mlp.experts.down_proj_blocks", ST_U8, 4, {4, 32, 1, 16}, 0, 4, 0},
		{"gpt-oss", "{\"num_local_experts\": 4}", "model.layers.0.mlp.experts.down_proj_bias", ST_BF16, 2, {4, 32}, 0, 4, 0},
		{"llama4", "{\"text_config\": {\"num_local_experts\": 16}}", "language_model.model.layers.1.feed_forward.experts.gate_up_proj",
		 ST_BF16, 3, {16, 32, 64}, 0, 16, 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		tp_plan pl;
		tp_err e;
		if (tp_plan_builtin(cases[i].plan, &pl, &e) < 0)
			fail_msg("%s: %s", cases[i].plan, e.msg);
		const want w[] = {{cases[i].name, cases[i].dt, cases[i].ndim,
				   {cases[i].shape[0], cases[i].shape[1], cases[i].shape[2], cases[i].shape[3]}, 0, 0, 0, 0, 0, 0}};
		cJSON *c = cJSON_Parse(cases[i].config);
		tp_expr_ctx cx = {.config = c, .nprefix = pl.nprefix};
		for (int k = 0; k < pl.nprefix; k++)
			cx.prefix[k] = pl.prefix[k];
		int64_t E[TP_MAX_EXPERT_DECLS];
		if (tp_plan_ep_check(&pl, &cx, 2, 0, E, &e) < 0)
			fail_msg("%s: %s", cases[i].plan, e.msg);
		load(w, 1);
		tp_resolve_opts o = {.T = 2, .ep = 1};
		tp_resolved res;
		if (tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "f", &res, &e) < 0)
			fail_msg("%s: %s: %s", cases[i].plan, cases[i].name, e.msg);
		if (res.rule != TP_RULE_EXPERTS || !(res.spec.flags & TP_EXPERT) ||
		    (cases[i].owned && (res.spec.kind != TP_OWNED || res.spec.seg[0] != cases[i].E || res.spec.owner != cases[i].owner)) ||
		    (!cases[i].owned && (res.spec.kind != TP_SPLIT || res.spec.axis != 0 || res.spec.seg[0] != cases[i].E || res.spec.unit != 1)))
			fail_msg("%s: %s: %s (kind %d, units %llu)", cases[i].plan, cases[i].name, res.why, res.spec.kind,
				 (unsigned long long)res.spec.seg[0]);
		cJSON_Delete(c);
		tp_plan_free(&pl);
	}
	/* the shared experts of the MoE plans are not routed experts */
	const char *shared[][2] = {{"deepseek", "model.layers.1.mlp.shared_experts.up_proj.weight"},
				   {"kda", "model.layers.1.block_sparse_moe.shared_experts.up_proj.weight"},
				   {"qwen-moe", "model.layers.1.mlp.shared_expert.up_proj.weight"},
				   {"ernie4_5-moe", "model.layers.1.mlp.shared_experts.up_proj.weight"},
				   {"llama4", "model.layers.1.feed_forward.shared_expert.up_proj.weight"}};
	for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
		tp_plan pl;
		tp_err e;
		assert_int_equal(tp_plan_builtin(shared[i][0], &pl, &e), 0);
		const want w[] = {{shared[i][1], ST_BF16, 2, {16, 32}, 0, 0, 0, 0, 0, 0}};
		cJSON *c = cJSON_Parse("{\"moe_intermediate_size\": 16, \"n_shared_experts\": 1, \"shared_expert_intermediate_size\": 16,"
				       " \"intermediate_size\": 16, \"moe_num_shared_experts\": 1}");
		tp_expr_ctx cx = {.config = c};
		load(w, 1);
		tp_resolve_opts o = {.T = 2, .ep = 1};
		tp_resolved res;
		if (tp_plan_resolve(&pl, &cx, &ck.t[0], lookup, &ck, &o, "f", &res, &e) < 0)
			fail_msg("%s: %s: %s", shared[i][0], shared[i][1], e.msg);
		if (res.experts != -1 || res.spec.kind != TP_SPLIT || res.spec.flags != 0)
			fail_msg("%s: %s: %s", shared[i][0], shared[i][1], res.why);
		cJSON_Delete(c);
		tp_plan_free(&pl);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_llama),       cmocka_unit_test(test_qwen_moe),    cmocka_unit_test(test_deepseek),
		cmocka_unit_test(test_kda),         cmocka_unit_test(test_qwen3_next),  cmocka_unit_test(test_generic),
		cmocka_unit_test(test_quantized),   cmocka_unit_test(test_vocab),       cmocka_unit_test(test_kinds),
		cmocka_unit_test(test_rule_errors), cmocka_unit_test(test_heads_axis_preferred), cmocka_unit_test(test_when_dp), cmocka_unit_test(test_choice),      cmocka_unit_test(test_model_open_missing),
		cmocka_unit_test(test_bare_reference), cmocka_unit_test(test_ep_resolve),  cmocka_unit_test(test_ep_declarations),
		cmocka_unit_test(test_ep_builtins),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
