/* test_expr.c: the plan expression language (expr.h) on its own: arithmetic and its checks,
 * config lookups (nested keys, prefixes, lists, missing values), short-circuit evaluation of
 * && || ?:, and hostile input (INT64_MIN / -1, % -1, deep nesting on every recursive path,
 * literals that do not fit). Expected values are worked out by hand from the grammar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"

static const char *config_text =
	"{\"num_attention_heads\": 32, \"hidden_size\": 4096, \"num_key_value_heads\": null,"
	" \"layer_types\": [\"linear_attention\", \"full_attention\"],"
	" \"linear_attn_config\": {\"num_heads\": 64, \"head_dim\": 128, \"kda_layers\": [1, 3]},"
	" \"text_config\": {\"hidden_size\": 2048, \"vocab_size\": 1000},"
	" \"huge\": 1e300, \"half\": 2.5, \"flag\": true, \"obj\": {\"a\": 1},"
	" \"rope_scaling\": {\"original_max_position_embeddings_of_a_long_name\": 4096}, \"head_dim\": 64, \"v_head_dim\": 32,"
	" \"tie\": false, \"path\": \"a-name-of-more-than-forty-characters-in-all.json\","
	" \"many\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]}";

static cJSON *config;

static tp_expr_ctx ctx(int prefixed)
{
	tp_expr_ctx c;
	memset(&c, 0, sizeof c);
	c.config = config;
	if (prefixed) {
		c.prefix[0] = "text_config";
		c.nprefix = 1;
	}
	return c;
}

/* Evaluates src and requires the value want. */
static void ok(const char *src, int64_t want)
{
	tp_expr_ctx c = ctx(0);
	tp_expr_bind(&c, "i", 1);
	tp_err e;
	tp_err_clear(&e);
	int64_t v = -12345;
	int rc = tp_expr_int(&c, src, &v, &e);
	if (rc != 0 || v != want)
		fail_msg("'%s': rc %d value %lld (want %lld): %s", src, rc, (long long)v, (long long)want, e.msg);
}

/* Evaluates src and requires an error (TP_ERULE) whose message contains want. */
static void bad(const char *src, const char *want)
{
	tp_expr_ctx c = ctx(0);
	tp_expr_bind(&c, "i", 1);
	tp_err e;
	tp_err_clear(&e);
	int64_t v;
	int rc = tp_expr_int(&c, src, &v, &e);
	if (rc == 0 || e.code != TP_ERULE || !strstr(e.msg, want))
		fail_msg("'%.60s': rc %d code %d msg '%s' (want '%s')", src, rc, e.code, e.msg, want);
}

static int setup(void **state)
{
	(void)state;
	config = cJSON_Parse(config_text);
	return config ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	cJSON_Delete(config);
	return 0;
}

static void test_arithmetic(void **state)
{
	(void)state;
	ok("1 + 2 * 3", 7);
	ok("(1 + 2) * 3", 9);
	ok("10 - 4 - 3", 3);
	ok("12 / 4 / 3", 1);
	ok("17 % 5", 2);
	ok("-3 + 5", 2);
	ok("--3", 3);
	ok("2 < 3 && 3 <= 3 && 4 > 3 && 4 >= 4 && 1 == 1 && 1 != 2", 1);
	ok("!0 + !5", 1);
	ok("cdiv(7, 2) + min(3, 9) * 10 + max(3, 9) * 100", 4 + 30 + 900);
	ok("9223372036854775807", INT64_MAX);
	ok("-9223372036854775807 - 1", INT64_MIN);
	bad("7 / 2", "7 / 2 is not exact");
	bad("1 / 0", "division by zero");
	bad("1 % 0", "division by zero");
	bad("4611686018427387904 * 2", "multiplication overflows");
	bad("9223372036854775807 + 1", "addition overflows");
	bad("cdiv(1, 0)", "division by a non-positive number");
	bad("(3 +", "unexpected text");
	bad("3 3", "unexpected text at '3'");
	bad("nosuch(1)", "unknown function or wrong number of arguments: nosuch()");
	bad("min(1)", "unknown function or wrong number of arguments: min()");
}

static void test_config(void **state)
{
	(void)state;
	ok("num_attention_heads * 128 / hidden_size", 1);
	ok("linear_attn_config.num_heads * linear_attn_config.head_dim", 8192);
	ok("layer_types[i] == 'full_attention'", 1);
	ok("layer_types[0] == \"linear_attention\"", 1);
	ok("has(layer_types[2])", 0);  /* past the end is missing */
	ok("in(i + 2, linear_attn_config.kda_layers)", 1);
	ok("in(2, linear_attn_config.kda_layers)", 0);
	ok("in(2, nosuch)", 0);
	ok("len(layer_types)", 2);
	ok("first(num_key_value_heads, nosuch, 8)", 8); /* null counts as missing */
	ok("has(num_key_value_heads)", 0);
	ok("flag + 1", 2);
	bad("nosuch + 1", "key 'nosuch' is missing from config.json");
	bad("half", "config value 'half' is not an integer");
	bad("huge", "config value 'huge' is not an integer");
	bad("obj", "config value 'obj' is an object, not a value");
	ok("has(obj)", 1); /* an object is present (has(quantization_config.kv_cache_scheme)) ... */
	ok("!has(obj) || 2 > 1", 1);
	bad("first(obj, 1)", "only has() takes one"); /* ... and has() is all that takes one */
	bad("has(obj + 1)", "is not an integer");
	ok("has(half)", 1); /* a number that is not an integer is present (has(layernorm_epsilon)) ... */
	ok("has(half) && has(huge)", 1);
	bad("first(half, 1)", "config value 'half' is not an integer (only has() takes one)"); /* ... not a value */
	bad("half + 1", "config value 'half' is not an integer");
	bad("len(nosuch)", "key 'nosuch' is missing");
	/* a missing value at the top: rc 1, TP_ERULE, naming the key */
	tp_expr_ctx c = ctx(0);
	tp_err e;
	int64_t v;
	assert_int_equal(tp_expr_int(&c, "first(nosuch, other)", &v, &e), 1);
	assert_int_equal(e.code, TP_ERULE);
	assert_non_null(strstr(e.msg, "key 'other' is missing"));
	/* prefixes are searched first */
	c = ctx(1);
	assert_int_equal(tp_expr_int(&c, "hidden_size + vocab_size + num_attention_heads", &v, &e), 0);
	assert_int_equal(v, 2048 + 1000 + 32);
	assert_non_null(strstr(tp_expr_used(&c), "hidden_size=2048"));
	/* each key once, whole (a long dotted name; a key that is the end of another) */
	c = ctx(0);
	assert_int_equal(tp_expr_int(&c, "rope_scaling.original_max_position_embeddings_of_a_long_name * 2 + "
				     "rope_scaling.original_max_position_embeddings_of_a_long_name + v_head_dim + head_dim",
				     &v, &e), 0);
	assert_string_equal(tp_expr_used(&c), "rope_scaling.original_max_position_embeddings_of_a_long_name=4096, "
					      "v_head_dim=32, head_dim=64");
}

static void test_short_circuit(void **state)
{
	(void)state;
	/* the untaken side is parsed, never evaluated */
	ok("has(foo) && foo > 3", 0);
	ok("!has(foo) || foo > 3", 1);
	ok("has(num_attention_heads) && num_attention_heads > 3", 1);
	ok("0 && 1 / 0", 0);
	ok("1 || 1 / 0", 1);
	ok("1 ? 2 : foo", 2);
	ok("0 ? foo * 7 / 0 : 3", 3);
	ok("has(foo) ? foo : 16", 16);
	ok("0 && (9223372036854775807 + 1 > 0)", 0);
	ok("0 && first(a, b, c)[4] > 2 ? 5 : 6", 6);
	ok("1 ? 1 ? 2 : x : y", 2);
	ok("0 ? x : 0 ? y : 4", 4);
	ok("has(foo) && len(foo) > 0 || 7 == 7", 1);
	/* taken sides still fail */
	bad("1 && foo > 3", "key 'foo' is missing");
	bad("0 || 1 / 0", "division by zero");
	bad("0 ? 1 : foo", "key 'foo' is missing");
	/* syntax errors and unknown functions in the untaken side are still errors */
	bad("0 && (3 +", "unexpected text");
	bad("1 || nosuch(1)", "unknown function");
	bad("1 ? 2 3", "expected ':'");
	/* the untaken side does not count as a key the evaluation read */
	tp_expr_ctx c = ctx(0);
	tp_err e;
	int64_t v;
	assert_int_equal(tp_expr_int(&c, "0 && hidden_size > 1 ? num_attention_heads : 5", &v, &e), 0);
	assert_int_equal(v, 5);
	assert_null(strstr(tp_expr_used(&c), "hidden_size"));
	assert_null(strstr(tp_expr_used(&c), "num_attention_heads"));
	/* conditions: missing is false */
	assert_int_equal(tp_expr_cond(&c, "foo", &e), 0);
	assert_int_equal(tp_expr_cond(&c, "has(foo) && foo == 3", &e), 0);
}

static void test_overflow(void **state)
{
	(void)state;
	bad("(-9223372036854775807 - 1) / -1", "division overflows");
	bad("(-9223372036854775807 - 1) % -1", "remainder overflows");
	bad("-(-9223372036854775807 - 1)", "negation overflows");
	ok("(-9223372036854775807 - 1) / 1", INT64_MIN);
	ok("(-9223372036854775807) % -1", 0);
	bad("cdiv(9223372036854775807, 2)", "overflows");
	bad("99999999999999999999", "the literal 99999999999999999999 does not fit in a signed 64-bit integer");
	bad("9223372036854775808", "does not fit");
	bad("1 + 123456789012345678901234567890123", "does not fit");
}

/* first() evaluates its arguments left to right and stops at the first present one (issue 51:
 * first(head_dim, hidden_size / num_attention_heads) with head_dim given and heads not dividing the
 * hidden size was "4096 / 7 is not exact"); has() of an index into a missing list does not
 * evaluate the index. Both failed before: the arguments were all evaluated. */
static void test_lazy_first_has(void **state)
{
	(void)state;
	ok("first(head_dim, hidden_size / 7)", 64);
	ok("first(head_dim, 1 / 0)", 64);
	ok("first(nosuch, head_dim, nosuch2 + 1)", 64);
	ok("first(nosuch, num_key_value_heads, 5, 9223372036854775807 + 1)", 5);
	ok("has(nosuch[hidden_size / 7])", 0);
	ok("first(nosuch[1 / 0], 5)", 5);
	ok("has(layer_types[0]) && first(head_dim, 1 / 0) == 64", 1);
	/* the arguments before the present one are evaluated, and fail as they do anywhere */
	bad("first(nosuch, hidden_size / 7)", "4096 / 7 is not exact");
	bad("first(nosuch + 1, head_dim)", "key 'nosuch' is missing");
	/* a skipped argument is still parsed */
	bad("first(head_dim, (1 +)", "unexpected text");
	bad("first(head_dim, nosuch(1))", "unknown function");
	/* a skipped argument is not a key the evaluation read */
	tp_expr_ctx c = ctx(0);
	tp_err e;
	int64_t v;
	assert_int_equal(tp_expr_int(&c, "first(head_dim, hidden_size / num_attention_heads)", &v, &e), 0);
	assert_int_equal(v, 64);
	assert_string_equal(tp_expr_used(&c), "head_dim=64");
	assert_int_equal(tp_expr_int(&c, "first(nosuch, hidden_size / num_attention_heads)", &v, &e), 0);
	assert_int_equal(v, 128);
	assert_string_equal(tp_expr_used(&c), "hidden_size=4096, num_attention_heads=32");
}

/* tp_expr_used (the "key=value" list of a refusal) prints every kind of value: a boolean as
 * true / false (issue 51: "tie_word_embeddings=?"), strings quoted and cut at 40 characters, lists
 * by their first elements and their count, objects as {...}. */
static void test_used_values(void **state)
{
	(void)state;
	tp_expr_ctx c = ctx(0);
	tp_err e;
	assert_int_equal(tp_expr_cond(&c, "flag && !tie && has(obj) && layer_types[0] == 'linear_attention' && "
				      "in(3, linear_attn_config.kda_layers) && path != 'x' && len(many) == 20", &e), 1);
	assert_string_equal(tp_expr_used(&c), "flag=true, tie=false, obj={...}, "
					      "layer_types=['linear_attention', 'full_attention'], "
					      "linear_attn_config.kda_layers=[1, 3], "
					      "path='a-name-of-more-than-forty-characters-in-...', "
					      "many=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, ... 20 entries]");
	assert_int_equal(tp_expr_cond(&c, "half > 2 && huge > 2", &e), -1); /* not integers: refused, still shown */
	assert_string_equal(tp_expr_used(&c), "half=2.5");
}

/* An index outside a list (past its end, or negative) is an error, as any other use of a missing
 * value is, unless has() or first() asks (issue 50: architectures[5] == 'x' was false): an MTP layer
 * past layer_types is first(layer_types[i], 'full_attention'). Before, every bad() here was 0. */
static void test_index_outside(void **state)
{
	(void)state;
	bad("layer_types[5] == 'x'", "index 5 is past the end of 'layer_types' (2 entries): has(layer_types[5]) tests "
				     "for it, first(layer_types[5], default) gives a default");
	bad("layer_types[i + 1] != 'x'", "index 2 is past the end of 'layer_types' (2 entries)");
	bad("layer_types[-1] == 'x'", "index -1 is negative, in 'layer_types' (2 entries)");
	bad("linear_attn_config.kda_layers[2] + 1", "index 2 is past the end of 'linear_attn_config.kda_layers'");
	bad("1 ? layer_types[9] : 0", "past the end"); /* the taken branch */
	ok("0 ? layer_types[9] : 7", 7);              /* the untaken one is not evaluated */
	ok("has(layer_types[5])", 0);
	ok("has(layer_types[-1])", 0);
	ok("has(layer_types[i])", 1);
	ok("first(layer_types[5], 'full_attention') == 'full_attention'", 1);
	ok("first(layer_types[len(layer_types)], 'mtp') == 'mtp'", 1);
	ok("has(layer_types[5]) && layer_types[5] == 'x'", 0);
	ok("first(linear_attn_config.kda_layers[1], 0)", 3);
	tp_expr_ctx c = ctx(0);
	tp_err e;
	assert_int_equal(tp_expr_cond(&c, "architectures[5] == 'x'", &e), 0); /* a missing list stays missing */
	assert_int_equal(tp_expr_cond(&c, "layer_types[5] == 'x'", &e), -1);  /* a condition fails too */
	assert_non_null(strstr(e.msg, "past the end"));
}

/* Builds prefix^n core suffix^n. */
static char *nest(const char *prefix, const char *core, const char *suffix, int n)
{
	size_t lp = strlen(prefix), ls = strlen(suffix), lc = strlen(core);
	char *s = malloc((lp + ls) * (size_t)n + lc + 1), *w = s;
	assert_non_null(s);
	for (int i = 0; i < n; i++, w += lp)
		memcpy(w, prefix, lp);
	memcpy(w, core, lc);
	w += lc;
	for (int i = 0; i < n; i++, w += ls)
		memcpy(w, suffix, ls);
	*w = 0;
	return s;
}

static void test_depth(void **state)
{
	(void)state;
	/* every recursive path, 10,000 deep: an error, never a crash */
	struct {
		const char *pre, *core, *suf;
	} paths[] = {
		{"1?", "1", ":0"},             /* the branches of ?: */
		{"0?0:", "1", ""},             /* the else branch */
		{"(", "1", ")"},               /* parentheses */
		{"!", "1", ""},                /* unary ! */
		{"-", "1", ""},                /* unary - */
		{"min(", "1", ",1)"},          /* function arguments */
		{"layer_types[", "0", "]"},    /* indexes */
		{"0&&(", "1", ")"},            /* an untaken side */
	};
	for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
		char *s = nest(paths[k].pre, paths[k].core, paths[k].suf, 10000);
		bad(s, "nested more than 100 levels deep");
		free(s);
	}
	/* a reasonable depth still works */
	char *s = nest("(", "7", ")", 40);
	ok(s, 7);
	free(s);
	s = nest("1?", "3", ":0", 40);
	ok(s, 3);
	free(s);
}

/* A view's condition context: config.json with the plan's prefixes first, then the top, then the
 * view's defaults (the one lookup order); the first key found nowhere, outside has() and first(),
 * noted in missing; tp_expr_check parses without reading anything. */
static void test_defaults_and_missing(void **state)
{
	(void)state;
	cJSON *d = cJSON_Parse("{\"tie_word_embeddings\": true, \"hidden_size\": 1, \"vocab_size\": 7}");
	tp_expr_ctx c = ctx(1);
	c.defaults = d;
	tp_err e;
	tp_err_clear(&e);
	int64_t v = 0;
	assert_int_equal(tp_expr_int(&c, "hidden_size", &v, &e), 0);
	assert_int_equal(v, 2048); /* text_config's, before the top's and the default's */
	assert_int_equal(tp_expr_int(&c, "vocab_size + num_attention_heads", &v, &e), 0);
	assert_int_equal(v, 1032);
	assert_int_equal(tp_expr_cond(&c, "tie_word_embeddings && flag", &e), 1); /* a default, then the top */
	assert_string_equal(c.missing, "");
	assert_int_equal(tp_expr_cond(&c, "!tie_word_embedding", &e), 1); /* a typo: true, but noted */
	assert_string_equal(c.missing, "tie_word_embedding");
	assert_int_equal(tp_expr_cond(&c, "has(nope) || first(nope2, 1)", &e), 1);
	assert_string_equal(c.missing, ""); /* tested, not used: nothing noted */
	assert_int_equal(tp_expr_cond(&c, "T == 4 || nope3", &e), 0); /* T unbound: missing too */
	assert_string_equal(c.missing, "T");
	c.defaults = NULL;
	assert_int_equal(tp_expr_cond(&c, "tie_word_embeddings", &e), 0);
	assert_string_equal(c.missing, "tie_word_embeddings");
	assert_int_equal(tp_expr_check("a && (b || !c) ? d[i] : 'x' == e", &e), 0);
	assert_int_equal(tp_expr_check("a &&", &e), -1);
	assert_int_equal(tp_expr_check("a b", &e), -1);
	assert_non_null(strstr(e.msg, "unexpected text at 'b'"));
	cJSON_Delete(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_arithmetic), cmocka_unit_test(test_config), cmocka_unit_test(test_short_circuit),
		cmocka_unit_test(test_overflow),   cmocka_unit_test(test_depth), cmocka_unit_test(test_defaults_and_missing),
		cmocka_unit_test(test_lazy_first_has), cmocka_unit_test(test_used_values),
		cmocka_unit_test(test_index_outside),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
