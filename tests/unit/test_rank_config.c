/* test_rank_config.c: a rank's config.json written from the source text (rank_config.h), and the
 * SHA-256 the rank metadata uses (sha256.h). Expected texts are written out by hand from the
 * contract: only the named values change, every other byte stays; SHA-256 digests are the
 * FIPS 180-4 example vectors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "rank_config.h"
#include "rank_folder.h"
#include "sha256.h"

static void expect(const char *src, const tp_cfg_set *set, size_t n, const char *want)
{
	char *out;
	size_t len;
	tp_err e;
	if (tp_rank_config(src, strlen(src), set, n, "config.json", &out, &len, &e) < 0)
		fail_msg("refused: %s", e.msg);
	assert_int_equal(len, strlen(out));
	assert_string_equal(out, want);
	free(out);
}

static void refuse(const char *src, const tp_cfg_set *set, size_t n, const char *want)
{
	char *out = (char *)1;
	size_t len;
	tp_err e;
	tp_err_clear(&e);
	int rc = tp_rank_config(src, strlen(src), set, n, "config.json", &out, &len, &e);
	if (rc == 0 || !strstr(e.msg, want))
		fail_msg("rc %d msg '%s' (want '%s')", rc, e.msg, want);
	assert_null(out);
}

static void test_values_only(void **state)
{
	(void)state;
	const char *src = "{\n  \"num_attention_heads\": 64,\n  \"hidden_size\": 4096,\n  \"rope_theta\": 1e6,\n"
			  "  \"intermediate_size\":11008, \"x\": [64, {\"num_attention_heads\": 3}],\n"
			  "  \"num_key_value_heads\" : 8\n}\n";
	tp_cfg_set s[] = {{"num_attention_heads", 32, 0, 0, NULL}, {"intermediate_size", 5504, 0, 0, NULL}, {"num_key_value_heads", 4, 0, 0, NULL}};
	expect(src, s, 3,
	       "{\n  \"num_attention_heads\": 32,\n  \"hidden_size\": 4096,\n  \"rope_theta\": 1e6,\n"
	       "  \"intermediate_size\":5504, \"x\": [64, {\"num_attention_heads\": 3}],\n"
	       "  \"num_key_value_heads\" : 4\n}\n");
	/* nothing to set: the same bytes */
	expect(src, NULL, 0, src);
}

static void test_nested(void **state)
{
	(void)state;
	const char *src = "{\"architectures\":[\"X\"],\"text_config\":{\"num_attention_heads\":64,"
			  "\"linear_attn_config\":{\"num_heads\":32,\"head_dim\":128},\"vocab_size\":154880},"
			  "\"vision_config\":{\"num_attention_heads\":16},\"num_attention_heads\":64}";
	tp_cfg_set s[] = {{"text_config.num_attention_heads", 22, 0, 0, NULL},
			  {"text_config.linear_attn_config.num_heads", 16, 0, 0, NULL},
			  {"text_config.vocab_size", 77440, 0, 0, NULL},
			  {"num_attention_heads", 21, 0, 0, NULL}};
	expect(src, s, 4,
	       "{\"architectures\":[\"X\"],\"text_config\":{\"num_attention_heads\":22,"
	       "\"linear_attn_config\":{\"num_heads\":16,\"head_dim\":128},\"vocab_size\":77440},"
	       "\"vision_config\":{\"num_attention_heads\":16},\"num_attention_heads\":21}");
}

static void test_add(void **state)
{
	(void)state;
	tp_cfg_set s[] = {{"head_dim", 128, 1, 0, NULL}, {"num_attention_heads", 16, 1, 0, NULL}};
	expect("{\n    \"hidden_size\": 4096,\n    \"num_attention_heads\": 32\n}", s, 2,
	       "{\n    \"hidden_size\": 4096,\n    \"num_attention_heads\": 16,\n    \"head_dim\": 128\n}");
	tp_cfg_set t[] = {{"text_config.head_dim", 64, 1, 0, NULL}};
	expect("{\"text_config\": {}, \"a\": 1}", t, 1, "{\"text_config\": {\"head_dim\": 64}, \"a\": 1}");
	expect("{\"text_config\":{\"a\":1}}", t, 1, "{\"text_config\":{\"a\":1,\"head_dim\":64}}");
}

/* a string value (the --ep expert range), added or replacing a number */
static void test_string(void **state)
{
	(void)state;
	tp_cfg_set s[] = {{"tpfs_ep_size", 4, 1, 0, NULL}, {"tpfs_ep_experts", 0, 1, 0, "8-15"}};
	expect("{\n  \"a\": 1\n}", s, 2, "{\n  \"a\": 1,\n  \"tpfs_ep_size\": 4,\n  \"tpfs_ep_experts\": \"8-15\"\n}");
	/* two keys added to an empty object: a comma between them */
	expect("{}", s, 2, "{\"tpfs_ep_size\": 4,\"tpfs_ep_experts\": \"8-15\"}");
	tp_cfg_set t[] = {{"n", 0, 0, 0, "0-3,4-7"}};
	expect("{\"n\": 2}", t, 1, "{\"n\": \"0-3,4-7\"}");
}

static void test_refusals(void **state)
{
	(void)state;
	tp_cfg_set s[] = {{"num_attention_heads", 2, 0, 0, NULL}};
	refuse("{\"num_attention_heads\": \"64\"}", s, 1, "\"num_attention_heads\" is not a number");
	refuse("{\"hidden_size\": 64}", s, 1, "no key \"num_attention_heads\"");
	refuse("{\"num_attention_heads\": 64", s, 1, "not valid JSON");
	refuse("[1, 2]", s, 1, "not a JSON object");
	tp_cfg_set t[] = {{"text_config.head_dim", 2, 1, 0, NULL}};
	refuse("{\"head_dim\": 4}", t, 1, "its object is missing");
	/* a key with an escape is the key a JSON reader decodes (test_key_escapes) */
	expect("{\"num_attention\\u005fheads\": 64}", s, 1, "{\"num_attention\\u005fheads\": 2}");
}

/* Deep nesting and key paths longer than any set path: nothing inside them is matched, the rest
 * is rewritten as usual, and nothing is added inside them. */
static void test_deep(void **state)
{
	(void)state;
	size_t cap = 200000, n = 0;
	char *src = malloc(cap), *want = malloc(cap);
	n += (size_t)snprintf(src + n, cap - n, "{\"x\":");
	for (int i = 0; i < 250; i++)
		n += (size_t)snprintf(src + n, cap - n, "[{\"k\":");
	n += (size_t)snprintf(src + n, cap - n, "{}");
	for (int i = 0; i < 250; i++)
		n += (size_t)snprintf(src + n, cap - n, "}]");
	n += (size_t)snprintf(src + n, cap - n, ",\"");
	memset(src + n, 'y', 3000);
	n += 3000;
	n += (size_t)snprintf(src + n, cap - n, "\":{\"b\":{}},\"a\":{\"b\":5}}");
	memcpy(want, src, n + 1);
	memcpy(strstr(want, "\"b\":5") + 4, "2", 1);
	tp_cfg_set s[] = {{"a.b", 2, 0, 0, NULL}};
	expect(src, s, 1, want);
	tp_cfg_set t[] = {{"a.b", 2, 0, 0, NULL}, {"c", 7, 1, 0, NULL}};
	memcpy(want + strlen(want) - 1, ",\"c\":7}", 8);
	expect(src, t, 2, want);
	free(src);
	free(want);
}

static void test_null(void **state)
{
	(void)state;
	tp_cfg_set s[] = {{"pad_token_id", 0, 0, 1, NULL}, {"text_config.pad_token_id", 72, 0, 0, NULL}};
	expect("{\"pad_token_id\": 200, \"text_config\": {\"pad_token_id\": 200}}", s, 2,
	       "{\"pad_token_id\": null, \"text_config\": {\"pad_token_id\": 72}}");
}

/* cJSON's quirks are refused, not served (found by fuzzing before): it skips NUL bytes as whitespace and stops after the
 * first value, where Python's json refuses the text ("Expecting value", "Extra data"): a rank
 * config made from it would not load (json_strict.h). */
static void test_cjson_quirks(void **state)
{
	(void)state;
	static const char nul[] = "{\"x\": [0,\0\0 {\"y\": 2}], \"n\":\0 4}";
	char *out = (char *)1;
	size_t len;
	tp_err e;
	tp_cfg_set s[] = {{"n", 2, 0, 0, NULL}};
	assert_int_equal(tp_rank_config(nul, sizeof nul - 1, s, 1, "c", &out, &len, &e), -1);
	assert_non_null(strstr(e.msg, "Expecting value"));
	assert_null(out);
	tp_cfg_set t[] = {{"x", 7, 1, 0, NULL}, {"a.b", 3, 0, 0, NULL}};
	refuse("{\"\":{\"c\":1},\"a.b\":5,\"a\":{\"b\":6}} trailing", t, 2, "Extra data");
	/* only plain keys are path components: an empty key is not the top level, "a.b" is not a
	 * then b (found by fuzzing) */
	expect("{\"\":{\"c\":1},\"a.b\":5,\"a\":{\"b\":6}}", t, 2, "{\"\":{\"c\":1},\"a.b\":5,\"a\":{\"b\":3},\"x\":7}");
	refuse("{\"a\": \"tab\there\"}", t, 2, "Invalid control character");
	refuse("{\"a\": 01}", t, 2, "leading zero");
}

/* A key is matched by what a JSON reader decodes from it (Python's json keeps the last of
 * duplicate keys, cJSON the first: every one is rewritten, and an object named twice gets an
 * added key in both). A key holding NUL is refused: readers disagree on where it ends. */
static void test_key_escapes(void **state)
{
	(void)state;
	tp_cfg_set s[] = {{"num_attention_heads", 4, 0, 0, NULL}};
	expect("{\"num_attention_heads\": 8, \"num_attention_he\\u0061ds\": 8}", s, 1,
	       "{\"num_attention_heads\": 4, \"num_attention_he\\u0061ds\": 4}");
	/* a UTF-16 pair and two-byte escapes decode to something else: left alone */
	expect("{\"num_attention_heads\\ud83d\\ude00\": 8, \"num\\u005fattention_heads\": 8, \"a\\u002eb\": 1}", s, 1,
	       "{\"num_attention_heads\\ud83d\\ude00\": 8, \"num\\u005fattention_heads\": 4, \"a\\u002eb\": 1}");
	refuse("{\"num_attention_heads\\u0000x\": 8, \"num_attention_heads\": 3}", s, 1, "NUL character");
	tp_cfg_set t[] = {{"t.n", 2, 0, 0, NULL}, {"t.h", 5, 1, 0, NULL}};
	expect("{\"t\":{\"n\":4},\"t\":{\"n\":4,\"h\":1}}", t, 2, "{\"t\":{\"n\":2,\"h\":5},\"t\":{\"n\":2,\"h\":5}}");
}

/* The rule text of the resolved plan (tp_resolved_rule) against cJSON_PrintUnformatted of the
 * same object built with cJSON (what the digest was computed from before, and what `tpfs plan
 * --json` prints): names with quotes, backslashes, control and high bytes; numbers past
 * INT_MAX, past 1e15 and at 2^53; segments and flags. */
static cJSON *ref_rule(const tp_plan *pl, const st_tensor *t, const tp_resolved *res)
{
	const tp_spec *s = &res->spec;
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "match", t->name);
	if (s->kind != TP_SPLIT) {
		cJSON_AddStringToObject(j, "split", "replicate");
		return j;
	}
	cJSON_AddStringToObject(j, "split", "axis");
	cJSON_AddNumberToObject(j, "axis", s->axis);
	cJSON_AddNumberToObject(j, "unit", (double)s->unit);
	cJSON_AddNumberToObject(j, "size", (double)res->logical);
	cJSON_AddNumberToObject(j, "div", (double)s->div);
	if (s->nseg > 1) {
		cJSON *sg = cJSON_AddArrayToObject(j, "segments");
		for (uint32_t k = 0; k < s->nseg; k++) {
			uint64_t u = s->segu[k] ? s->segu[k] : s->unit;
			cJSON *so = cJSON_CreateObject();
			cJSON_AddNumberToObject(so, "size", (double)(s->seg[k] * u));
			cJSON_AddNumberToObject(so, "unit", (double)u);
			cJSON_AddItemToArray(sg, so);
		}
	}
	if (s->flags & TP_UNEVEN)
		cJSON_AddTrueToObject(j, "uneven");
	if (s->flags & TP_GROUPS)
		cJSON_AddTrueToObject(j, "groups");
	if (res->rule >= 0 && pl->rules[res->rule].vocab)
		cJSON_AddTrueToObject(j, "vocab");
	return j;
}

static void test_resolved_rule_text(void **state)
{
	(void)state;
	uint64_t x = 88172645463325252ULL;
	tp_rule rules[2];
	memset(rules, 0, sizeof rules);
	rules[1].vocab = 1;
	tp_plan pl;
	memset(&pl, 0, sizeof pl);
	pl.rules = rules;
	pl.nrules = 2;
	static const uint64_t big[] = {0, 1, 7, 2147483647ULL, 2147483648ULL, 4294967296ULL, 999999999999999ULL,
				       1000000000000000ULL, 123456789012345678ULL, 9007199254740992ULL, 9007199254740993ULL};
	const size_t nb = sizeof big / sizeof *big;
	for (int it = 0; it < 3000; it++) {
		char name[40];
		size_t nl = 1 + it % 30;
		for (size_t k = 0; k < nl; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			unsigned char c = (unsigned char)(x % 4 ? 'a' + x % 26 : 1 + (x >> 8) % 255);
			name[k] = (char)c;
		}
		name[nl] = 0;
		st_tensor t;
		memset(&t, 0, sizeof t);
		t.name = name;
		tp_resolved res;
		memset(&res, 0, sizeof res);
		res.rule = (int)((x >> 20) % 3) - 1;
		res.spec = (x >> 24) % 5 ? tp_spec_split((uint32_t)(x >> 28) % 4, big[(x >> 32) % nb], big[(x >> 36) % nb])
					 : tp_spec_replicate();
		res.spec.div = big[(x >> 40) % nb] | 1;
		res.spec.flags = (uint32_t)((x >> 44) % 4);
		res.spec.nseg = 1 + (uint32_t)((x >> 48) % 3);
		for (uint32_t k = 0; k < res.spec.nseg; k++) {
			res.spec.seg[k] = 1 + (x >> (50 + k)) % 64;
			res.spec.segu[k] = (x >> (52 + k)) % 3 ? 0 : big[(x >> (54 + k)) % 4];
		}
		res.logical = big[(x >> 56) % nb];
		cJSON *j = ref_rule(&pl, &t, &res);
		char *want = cJSON_PrintUnformatted(j);
		cJSON_Delete(j);
		tp_text b = {0};
		tp_resolved_rule(&b, &pl, &t, &res);
		assert_false(b.oom);
		if (strcmp(b.p, want))
			fail_msg("rule text differs from cJSON's:\n got  %s\n want %s", b.p, want);
		free(want);
		free(b.p);
	}
	/* a routed expert placed by an experts declaration: no rule */
	st_tensor t = {.name = "e"};
	tp_resolved res = {.rule = TP_RULE_EXPERTS};
	tp_text b = {0};
	tp_resolved_rule(&b, &pl, &t, &res);
	assert_int_equal(b.len, 0);
}

static void test_sha256(void **state)
{
	(void)state;
	char hex[65];
	tp_sha256_hex("abc", 3, hex);
	assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	tp_sha256_hex("", 0, hex);
	assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	tp_sha256_hex(two, strlen(two), hex);
	assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	/* a million 'a', fed in uneven pieces */
	tp_sha256 s;
	uint8_t d[32];
	char a[997];
	memset(a, 'a', sizeof a);
	tp_sha256_init(&s);
	size_t left = 1000000;
	for (size_t k = 1; left; k = k % 996 + 1) {
		size_t n = k < left ? k : left;
		tp_sha256_update(&s, a, n);
		left -= n;
	}
	tp_sha256_final(&s, d);
	static const uint8_t want[32] = {0xcd, 0xc7, 0x6e, 0x5c, 0x99, 0x14, 0xfb, 0x92, 0x81, 0xa1, 0xc7,
					 0xe2, 0x84, 0xd7, 0x3e, 0x67, 0xf1, 0x80, 0x9a, 0x48, 0xa4, 0x97,
					 0x20, 0x0e, 0x04, 0x6d, 0x39, 0xcc, 0xc7, 0x11, 0x2c, 0xd0};
	assert_memory_equal(d, want, 32);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_values_only), cmocka_unit_test(test_nested), cmocka_unit_test(test_add), cmocka_unit_test(test_string),
		cmocka_unit_test(test_refusals), cmocka_unit_test(test_deep),
		cmocka_unit_test(test_cjson_quirks), cmocka_unit_test(test_null), cmocka_unit_test(test_key_escapes),
		cmocka_unit_test(test_resolved_rule_text),
		cmocka_unit_test(test_sha256),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
