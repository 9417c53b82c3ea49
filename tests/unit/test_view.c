/* test_view.c: engine view files (view.c): parsing, template matching, cat / stack / const /
 * rename / drop / if, the parts and their source tables, and every refusal, on small
 * header-only checkpoints. The bytes of served files are test_served's and
 * tests/py/test_view.py's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cJSON.h>

#include "expr.h"
#include "view.h"

/* A header of F32 tensors "name:rows" (each [rows, 4]) from a space-separated list. */
static void header(const char *list, st_header *h)
{
	char json[8192], names[4096];
	size_t w = 0;
	uint64_t off = 0;
	snprintf(names, sizeof names, "%s", list);
	w += (size_t)snprintf(json + w, sizeof json - w, "{");
	for (char *save, *tok = strtok_r(names, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		char *colon = strchr(tok, ':');
		unsigned rows = colon ? (unsigned)atoi(colon + 1) : 4;
		if (colon)
			*colon = 0;
		uint64_t n = (uint64_t)rows * 4 * 4;
		w += (size_t)snprintf(json + w, sizeof json - w, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%u,4],\"data_offsets\":[%llu,%llu]}",
				      w > 1 ? "," : "", tok, rows, (unsigned long long)off, (unsigned long long)(off + n));
		off += n;
	}
	w += (size_t)snprintf(json + w, sizeof json - w, "}");
	while (w % 8)
		json[w++] = ' ';
	tp_err e;
	if (st_parse_header(json, w, 8 + w + off, "src", h, &e) < 0)
		fail_msg("header: %s", e.msg);
}

typedef struct fixture {
	st_header h[3];
	tp_spec *specs[3];
	tp_vsource src[3];
	uint32_t n;
} fixture;

static void fx_add(fixture *f, const char *list)
{
	uint32_t k = f->n++;
	header(list, &f->h[k]);
	f->specs[k] = calloc(f->h[k].n + 1, sizeof *f->specs[k]);
	for (size_t i = 0; i < f->h[k].n; i++)
		f->specs[k][i] = tp_spec_split(0, f->h[k].t[i].shape[0], 1);
	f->src[k] = (tp_vsource){k == 0 ? "a.safetensors" : k == 1 ? "b.safetensors" : "c.safetensors", &f->h[k], f->specs[k]};
}

static void fx_free(fixture *f)
{
	for (uint32_t k = 0; k < f->n; k++) {
		st_header_free(&f->h[k]);
		free(f->specs[k]);
	}
}

static const char *VIEW_HEAD = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"t\", \"plans\": [\"llama\"], ";

/* Parses a view of the given tensors list (JSON array text) and resolves it over f. */
static int resolve(fixture *f, const char *tensors, const char *extra, tp_vplan *p, tp_err *e)
{
	char text[4096];
	snprintf(text, sizeof text, "%s%s\"tensors\": %s}", VIEW_HEAD, extra ? extra : "", tensors);
	tp_view v;
	if (tp_view_parse(text, strlen(text), "t.json", &v, e) < 0)
		return -2;
	int rc = tp_view_resolve(&v, NULL, f->src, f->n, p, e);
	tp_view_free(&v);
	return rc;
}

static const tp_sdesc *find(const tp_vplan *p, const char *name, size_t *part)
{
	for (size_t k = 0; k < p->nparts; k++)
		for (size_t j = 0; j < p->parts[k].n; j++)
			if (!strcmp(p->parts[k].d[j].name, name)) {
				if (part)
					*part = k;
				return &p->parts[k].d[j];
			}
	return NULL;
}

static const char *piece_name(const fixture *f, const tp_vplan *p, size_t part, const tp_pdesc *pd)
{
	return f->h[p->parts[part].srcs[pd->file]].t[pd->tensor].name;
}

static void test_cat_const_rename(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.q:8 L.0.k:4 L.0.v:4 L.0.o L.1.q:8 L.1.k:4 L.1.v:4 L.1.o embed:16 norm:1");
	tp_vplan p;
	tp_err e;
	int rc = resolve(&f, "[{\"name\": \"L.{i}.qkv\", \"cat\": [\"L.{i}.q\", \"L.{i}.k\", \"L.{i}.v\"]},"
			 " {\"name\": \"L.{i}.scale\", \"const\": {\"dtype\": \"F32\", \"value\": 1.0}, \"per\": \"L.{i}.o\"},"
			 " {\"name\": \"head\", \"from\": \"embed\", \"if\": \"!tensor('head')\"}]", NULL, &p, &e);
	if (rc < 0)
		fail_msg("%s", e.msg);
	size_t part;
	const tp_sdesc *d = find(&p, "L.1.qkv", &part);
	assert_non_null(d);
	assert_int_equal(d->npieces, 3);
	assert_int_equal(d->nstack, 0);
	assert_string_equal(piece_name(&f, &p, part, &d->pieces[0]), "L.1.q");
	assert_string_equal(piece_name(&f, &p, part, &d->pieces[2]), "L.1.v");
	assert_int_equal(d->pieces[0].spec.seg[0], 8); /* the plan's spec of that tensor */
	const tp_sdesc *c = find(&p, "L.0.scale", NULL);
	assert_non_null(c);
	assert_non_null(c->cbytes);
	float one;
	memcpy(&one, c->cbytes, 4);
	assert_true(one == 1.0f);
	assert_non_null(find(&p, "head", NULL));
	assert_null(find(&p, "embed", NULL)); /* used by the rename: not served under its own name */
	assert_null(find(&p, "L.0.q", NULL));
	assert_non_null(find(&p, "L.0.o", NULL)); /* keep_rest */
	assert_non_null(find(&p, "norm", NULL));
	assert_int_equal(p.ntensors, 2 + 2 + 1 + 2 + 1); /* qkv x2, scale x2, head, o x2, norm */
	assert_int_equal(p.nconsts, 2);
	tp_vplan_free(&p);
	fx_free(&f);
}

/* "if" with tensor('NAME'): evaluated per match by tp_view_resolve (NAME filled in from the match):
 * the head made from the embedding only where the source has none; a piece's presence required
 * for a cat (the match skipped otherwise, where a missing piece is refused without "if"). */
static void test_if_tensor(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "embed:16 head:16 L.0.q:8 L.0.k:4 L.1.q:8");
	tp_vplan p;
	tp_err e;
	assert_int_equal(resolve(&f, "[{\"name\": \"head\", \"from\": \"embed\", \"if\": \"!tensor('head')\"}]", NULL, &p, &e), 0);
	const tp_sdesc *d = find(&p, "head", NULL), *m = find(&p, "embed", NULL);
	assert_non_null(d);
	assert_non_null(m); /* untied: both keep their names */
	assert_string_equal(f.h[0].t[d->pieces[0].tensor].name, "head");
	tp_vplan_free(&p);
	const char *qk = "[{\"name\": \"L.{i}.qk\", \"cat\": [\"L.{i}.q\", \"L.{i}.k\"]%s}]";
	char t[512];
	snprintf(t, sizeof t, qk, "");
	assert_int_equal(resolve(&f, t, NULL, &p, &e), -1); /* L.1 has no k: refused */
	assert_non_null(strstr(e.msg, "source tensor 'L.1.k' is missing"));
	snprintf(t, sizeof t, qk, ", \"if\": \"tensor('L.{i}.k')\"");
	if (resolve(&f, t, NULL, &p, &e) < 0)
		fail_msg("%s", e.msg);
	assert_non_null(find(&p, "L.0.qk", NULL));
	assert_null(find(&p, "L.1.qk", NULL));
	assert_non_null(find(&p, "L.1.q", NULL)); /* kept: the entry does not apply to this match */
	tp_vplan_free(&p);
	/* per match, with config.json: T from the caller's context; without one, T is a missing key */
	snprintf(t, sizeof t, qk, ", \"if\": \"tensor('L.{i}.k') && T > 1\"");
	tp_expr_ctx c = {0};
	tp_expr_bind(&c, "T", 2);
	char text[1024];
	snprintf(text, sizeof text, "%s\"tensors\": %s}", VIEW_HEAD, t);
	tp_view v;
	assert_int_equal(tp_view_parse(text, strlen(text), "t.json", &v, &e), 0);
	assert_true(v.e[0].per_match);
	tp_vcfg vc = {.cond_ctx = &c};
	if (tp_view_resolve(&v, &vc, f.src, f.n, &p, &e) < 0)
		fail_msg("%s", e.msg);
	assert_non_null(find(&p, "L.0.qk", NULL));
	tp_vplan_free(&p);
	assert_int_equal(tp_view_resolve(&v, NULL, f.src, f.n, &p, &e), -1);
	if (!strstr(e.msg, "tensors[0] \"if\"") || !strstr(e.msg, "'T'"))
		fail_msg("%s", e.msg);
	tp_view_free(&v);
	/* a name with a variable the first piece does not bind, and tensor() of a non-string */
	snprintf(t, sizeof t, qk, ", \"if\": \"tensor('L.{j}.k')\"");
	assert_int_equal(resolve(&f, t, NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "does not bind"));
	snprintf(t, sizeof t, qk, ", \"if\": \"tensor(3)\"");
	assert_int_equal(resolve(&f, t, NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "expects a 'tensor name'"));
	fx_free(&f);
}

/* The condition keywords "if" replaced are refused, each naming its replacement, so that a view
 * written in the old language is not read with another meaning. */
static void test_old_keywords(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "embed:16 head:16");
	tp_vplan p;
	tp_err e;
	const char *old[] = {"\"when\": \"tie_word_embeddings\"", "\"unless\": \"tie_word_embeddings\"",
			     "\"if_missing\": \"head\"", "\"optional\": true"};
	const char *why[] = {"'when' is no longer a view keyword: write \"if\": EXPR",
			     "'unless' is no longer a view keyword: write \"if\": \"!(EXPR)\"",
			     "'if_missing' is no longer a view keyword: write \"if\": \"!tensor('NAME')\"",
			     "'optional' is no longer a view keyword: write \"if\": \"tensor('PIECE') && ...\""};
	for (int k = 0; k < 4; k++) {
		char t[256];
		snprintf(t, sizeof t, "[{\"name\": \"head\", \"from\": \"embed\", %s}]", old[k]);
		assert_int_equal(resolve(&f, t, NULL, &p, &e), -2);
		if (!strstr(e.msg, why[k]))
			fail_msg("%d: %s", k, e.msg);
	}
	/* tensor() outside a view entry's "if" (a plan's or a refusal's condition): an error */
	tp_expr_ctx c = {0};
	assert_int_equal(tp_expr_cond(&c, "tensor('head')", &e), -1);
	assert_non_null(strstr(e.msg, "only a view entry's \"if\" may use it"));
	fx_free(&f);
}

/* One removal keyword, "drop": a drop entry whose template ends in '*' and whose "if" reads the
 * variable it binds (the layers past config.json's count: DeepSeek's MTP layer) takes its tensors
 * out before every other entry, so that no other entry sees them (tensor() false, a cat whose first
 * piece is dropped makes nothing, keep_rest keeps nothing of them); a config.json without the key
 * is refused at resolution, naming it. '*' elsewhere than the end of a drop template, and a variable
 * an "if" reads of 16 characters or more, are refused. */
static void test_drop(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.q:8 L.0.k:4 L.1.q:8 L.1.k:4 L.2.q:8 L.2.k:4 L.2.eh:4 L.10.q:8 L.10.k:4 embed:16");
	const char *text = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"t\", \"plans\": [\"llama\"], \"tensors\": ["
			   "{\"name\": \"L.{i}.qk\", \"cat\": [\"L.{i}.q\", \"L.{i}.k\"]},"
			   "{\"name\": \"L.{i}.mark\", \"const\": {\"dtype\": \"F32\", \"value\": 1.0}, \"per\": \"L.{i}.q\","
			   " \"if\": \"tensor('L.{i}.k')\"},"
			   "{\"drop\": \"L.{n}.*\", \"if\": \"n >= num_hidden_layers\"}]}";
	tp_view v;
	tp_vplan p;
	tp_err e;
	assert_int_equal(tp_view_parse(text, strlen(text), "t.json", &v, &e), 0);
	assert_true(v.e[2].per_match); /* reads its variable n: decided per match */
	assert_false(v.e[0].per_match);
	cJSON *cfg = cJSON_Parse("{\"num_hidden_layers\": 2}");
	tp_expr_ctx c = {0};
	c.config = cfg;
	tp_vcfg vc = {.cond_ctx = &c};
	if (tp_view_resolve(&v, &vc, f.src, f.n, &p, &e) < 0)
		fail_msg("%s", e.msg);
	assert_non_null(find(&p, "L.1.qk", NULL));
	assert_non_null(find(&p, "L.1.mark", NULL));
	assert_null(find(&p, "L.2.qk", NULL)); /* layer 2 and 10 (>= 2, as numbers) dropped first: nothing made, */
	assert_null(find(&p, "L.10.qk", NULL));
	assert_null(find(&p, "L.2.mark", NULL)); /* nothing matched, */
	assert_null(find(&p, "L.2.eh", NULL)); /* nothing kept */
	assert_null(find(&p, "L.2.q", NULL));
	assert_non_null(find(&p, "embed", NULL));
	assert_int_equal(p.ntensors, 2 + 2 + 1); /* qk x2, mark x2, embed */
	tp_vplan_free(&p);
	cJSON_Delete(cfg); /* no count: refused, naming the key */
	cfg = cJSON_Parse("{\"hidden_size\": 2}");
	c.config = cfg;
	assert_int_equal(tp_view_resolve(&v, &vc, f.src, f.n, &p, &e), -1);
	if (!strstr(e.msg, "tensors[2] \"if\"") || !strstr(e.msg, "'num_hidden_layers'"))
		fail_msg("%s", e.msg);
	cJSON_Delete(cfg);
	tp_view_free(&v);
	/* a plain drop (no "if") of one tensor: the other entries' tensor() does not see it */
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.m\", \"const\": {\"dtype\": \"F32\", \"value\": 1.0}, "
				 "\"per\": \"L.{i}.q\", \"if\": \"tensor('L.{i}.k')\"}, {\"drop\": \"L.1.k\"}]", NULL, &p, &e), 0);
	assert_non_null(find(&p, "L.0.m", NULL));
	assert_null(find(&p, "L.1.m", NULL));
	assert_null(find(&p, "L.1.k", NULL));
	tp_vplan_free(&p);
	const char *bad[] = {"[{\"drop\": \"L.*.q\"}]", "[{\"name\": \"x*\", \"from\": \"embed\"}]",
			     "[{\"drop\": \"L.{abcdefghijklmnop}.*\", \"if\": \"abcdefghijklmnop > 1\"}]"};
	const char *why[] = {"'*' (any rest of the name) ends a drop template only", "'*' (any rest",
			     "a variable an \"if\" reads is at most 15 characters"};
	for (int k = 0; k < 3; k++) {
		assert_int_equal(resolve(&f, bad[k], NULL, &p, &e), -2);
		if (!strstr(e.msg, why[k]))
			fail_msg("%d: %s", k, e.msg);
	}
	fx_free(&f);
}

/* "if" over config.json: the caller settles it (tp_vcfg.off); an entry left off makes nothing. One parsed view
 * serves both settlings, in turn: resolving changes nothing of it. */
static void test_if(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "embed:16 head:16");
	const char *text = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"t\", \"plans\": [\"llama\"], \"tensors\": ["
			   "{\"name\": \"head\", \"from\": \"embed\", \"if\": \"tie_word_embeddings\"},"
			   "{\"drop\": \"head\", \"if\": \"tie_word_embeddings\"}]}";
	tp_view v;
	tp_err e;
	assert_int_equal(tp_view_parse(text, strlen(text), "t.json", &v, &e), 0);
	assert_string_equal(v.e[0].cond, "tie_word_embeddings");
	assert_false(v.e[0].per_match);
	const int order[] = {0, 1, 0, 1};
	for (int i = 0; i < 4; i++) {
		int tied = order[i];
		tp_vplan p;
		uint8_t off[2] = {!tied, !tied};
		tp_vcfg vc = {.off = off};
		if (tp_view_resolve(&v, &vc, f.src, f.n, &p, &e) < 0)
			fail_msg("%s", e.msg);
		const tp_sdesc *h = find(&p, "head", NULL);
		assert_non_null(h);
		assert_string_equal(f.h[0].t[h->pieces[0].tensor].name, tied ? "embed" : "head");
		assert_true((find(&p, "embed", NULL) == NULL) == tied);
		assert_int_equal(p.ntensors, tied ? 1 : 2);
		tp_vplan_free(&p);
	}
	tp_view_free(&v);
	fx_free(&f);
}

/* "refuse" is a list of {"if", "reason"}; "proven" a list of at most 4 strings. */
static void test_refuse_proven_parse(void **state)
{
	(void)state;
	const char *cases[] = {"\"refuse\": [{\"if\": \"T > 1\", \"reason\": \"r\"}]", /* ok */
			       "\"refuse\": [{\"if\": \"T > 1\"}]", "\"refuse\": {\"if\": \"T\", \"reason\": \"r\"}",
			       "\"refuse\": [{\"if\": 1, \"reason\": \"r\"}]",
			       "\"refuse\": [{\"if\": \"T\", \"reason\": \"r\", \"x\": 1}]",
			       "\"proven\": [\"a\", \"b\", \"c\", \"d\", \"e\"]", "\"proven\": [1]"};
	char text[512];
	for (int k = 0; k < 7; k++) {
		tp_view v;
		tp_err e;
		snprintf(text, sizeof text,
			 "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"t\", \"plans\": [\"llama\"], %s, "
			 "\"tensors\": []}",
			 cases[k]);
		int rc = tp_view_parse(text, strlen(text), "t.json", &v, &e);
		if (k == 0) {
			assert_int_equal(rc, 0);
			assert_non_null(v.refuse);
			tp_view_free(&v);
		} else {
			assert_int_equal(rc, -1);
			assert_non_null(strstr(e.msg, k < 5 ? "\"refuse\": a list of" : "\"proven\": a list of"));
		}
	}
}

/* "rules": parsed as a plan's rules when the view is, refused with the view's name where they are not
 * plan rules; tp_view_rules_plan makes the plan whose rules, extended by the plan the view applies
 * to, come first (a tensor both match takes the view's). */
static void test_rules(void **state)
{
	(void)state;
	const char *cases[] = {"\"rules\": [{\"name\": \"c\", \"match\": \"**.conv\", \"split\": \"column\"}]", /* ok */
			       "\"rules\": []", "\"rules\": {\"name\": \"c\"}",
			       "\"rules\": [{\"name\": \"c\", \"match\": \"**.conv\", \"split\": \"sideways\"}]"};
	char text[512];
	for (int k = 0; k < 4; k++) {
		tp_view v;
		tp_err e;
		snprintf(text, sizeof text,
			 "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"t\", \"plans\": [\"llama\"], %s, "
			 "\"tensors\": []}",
			 cases[k]);
		int rc = tp_view_parse(text, strlen(text), "t.json", &v, &e);
		if (k == 0) {
			assert_int_equal(rc, 0);
			tp_plan vp, base;
			assert_int_equal(tp_view_rules_plan(v.rules, "llama", v.origin, &vp, &e), 0);
			const char *btext = "{\"tpfs_plan\": 1, \"name\": \"llama\", \"rules\": [{\"name\": \"w\", \"match\": "
					    "\"**\", \"split\": \"replicate\"}]}";
			assert_int_equal(tp_plan_parse(btext, strlen(btext), "b", &base, &e), 0);
			assert_int_equal(tp_plan_extend(&vp, &base, &e), 0);
			assert_int_equal(vp.nrules, 2);
			assert_string_equal(vp.rules[0].name, "c"); /* the view's first: it wins */
			assert_string_equal(vp.rules[1].name, "w");
			assert_string_equal(vp.name, "llama");
			tp_plan_free(&vp);
			tp_view_free(&v);
		} else {
			assert_int_equal(rc, -1);
			assert_non_null(strstr(e.msg, "t.json: \"rules\""));
		}
	}
}

/* "extends": the built-in llama view under a file: fields replaced, an entry replaced where it
 * stands (same name; a drop by a drop of the same template), one removed ({"drop": {"entry": NAME}}),
 * one appended; and the refusals (no such view, an entry removal that takes nothing or holds more,
 * extends not a string, the old {"remove": NAME} naming its replacement). */
static void test_extends(void **state)
{
	(void)state;
	tp_view base, v;
	tp_err e;
	size_t l = 0;
	const char *lt = NULL;
	for (int i = 0; i < tp_view_builtin_count() && !lt; i++) {
		const char *t = tp_view_builtin_text(i, &l);
		if (strstr(t, "\"name\": \"llama\"") && strstr(t, "\"engine\": \"vllm\""))
			lt = t;
	}
	assert_non_null(lt);
	assert_int_equal(tp_view_parse(lt, l, "llama", &base, &e), 0);
	const char *text = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"child\", \"extends\": \"llama\", "
			   "\"model_types\": [\"x\"], \"tensors\": [{\"drop\": {\"entry\": \"lm_head.weight\"}}, "
			   "{\"drop\": \"lm_head.weight\"}, {\"name\": \"model.layers.{i}.mlp.gate_up_proj.weight\", "
			   "\"cat\": [\"model.layers.{i}.mlp.up_proj.weight\", \"model.layers.{i}.mlp.gate_proj.weight\"]}, "
			   "{\"name\": \"extra\", \"from\": \"model.norm.weight\"}]}";
	assert_int_equal(tp_view_parse(text, strlen(text), "child.json", &v, &e), 0);
	assert_string_equal(v.name, "child");
	assert_int_equal(v.nmodel_types, 1);
	assert_int_equal(v.nplans, base.nplans); /* inherited */
	assert_int_equal(v.pad_vocab, base.pad_vocab);
	assert_int_equal(v.ne, base.ne); /* one removed, one appended */
	int gate_up = -1, drop = -1, extra = -1, lm = -1;
	for (size_t k = 0; k < v.ne; k++) {
		if (v.e[k].name && !strcmp(v.e[k].name, "model.layers.{i}.mlp.gate_up_proj.weight"))
			gate_up = (int)k;
		if (v.e[k].kind == TP_VE_DROP && !strcmp(v.e[k].per, "lm_head.weight"))
			drop = (int)k;
		if (v.e[k].name && !strcmp(v.e[k].name, "extra"))
			extra = (int)k;
		if (v.e[k].name && !strcmp(v.e[k].name, "lm_head.weight"))
			lm = (int)k;
	}
	assert_true(gate_up >= 0 && !strcmp(v.e[gate_up].cat[0], "model.layers.{i}.mlp.up_proj.weight"));
	assert_true(drop >= 0 && v.e[drop].cond == NULL); /* the parent's conditional drop replaced */
	assert_int_equal(extra, (int)v.ne - 1);           /* appended */
	assert_int_equal(lm, -1);                         /* removed */
	for (size_t k = 0; k < base.ne; k++) /* replaced where it stood (the removed entry stood after it) */
		if (base.e[k].name && !strcmp(base.e[k].name, "model.layers.{i}.mlp.gate_up_proj.weight"))
			assert_int_equal(gate_up, (int)k);
	tp_view_free(&v);
	tp_view_free(&base);
	const char *bad[] = {"\"extends\": \"nope\", \"tensors\": []", "\"extends\": 3, \"tensors\": []",
			     "\"extends\": \"llama\", \"tensors\": [{\"drop\": {\"entry\": \"none\"}}]",
			     "\"extends\": \"llama\", \"tensors\": [{\"drop\": {\"entry\": \"lm_head.weight\"}, \"x\": 1}]",
			     "\"extends\": \"llama\", \"tensors\": [{\"drop\": {\"entry\": \"lm_head.weight\", \"x\": 1}}]",
			     "\"extends\": \"llama\", \"tensors\": [{\"remove\": \"lm_head.weight\"}]",
			     "\"plans\": [\"llama\"], \"tensors\": [{\"drop\": {\"entry\": \"lm_head.weight\"}}]"};
	const char *why[] = {"no built-in vllm view 'nope'", "names one built-in view", "takes away the entry",
			     "takes away the entry", "takes away the entry",
			     "'remove' is no longer a view keyword: write {\"drop\": {\"entry\": NAME}}",
			     "and this view inherits none"};
	char t2[512];
	for (int k = 0; k < 7; k++) {
		snprintf(t2, sizeof t2, "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"c\", %s}", bad[k]);
		assert_int_equal(tp_view_parse(t2, strlen(t2), "c.json", &v, &e), -1);
		assert_non_null(strstr(e.msg, why[k]));
	}
}

/* "extends": "ENGINE/NAME": another engine's built-in view (SGLang's views over vLLM's), its entries
 * and fields inherited, this view's engine its own; a view-level "drop" takes the parent's fields
 * away ("drop": ["pp"]: no stages); and the refusals (no such view of that engine, an empty engine,
 * null for the parent's refusals or defaults, null for any other field (naming "drop"), a "drop" of
 * a field the parent lacks, of one the file sets, of tensors, and in a view that extends none). */
static void test_extends_engine(void **state)
{
	(void)state;
	tp_view v;
	tp_err e;
	const char *text = "{\"tpfs_view\": 1, \"engine\": \"other\", \"name\": \"c\", \"extends\": \"vllm/llama\", "
			   "\"drop\": [\"pp\"], \"tensors\": [{\"drop\": {\"entry\": \"model.layers.{i}.self_attn.attn._k_scale\"}}]}";
	assert_int_equal(tp_view_parse(text, strlen(text), "c.json", &v, &e), 0);
	assert_string_equal(v.engine, "other");
	assert_int_equal(v.pad_vocab, 64);  /* vLLM's llama view's */
	assert_null(v.pp_layers);           /* taken away */
	int qkv = 0, k_scale = 0, v_scale = 0;
	for (size_t k = 0; k < v.ne; k++) {
		qkv += v.e[k].name && !strcmp(v.e[k].name, "model.layers.{i}.self_attn.qkv_proj.weight");
		k_scale += v.e[k].name && !strcmp(v.e[k].name, "model.layers.{i}.self_attn.attn._k_scale");
		v_scale += v.e[k].name && !strcmp(v.e[k].name, "model.layers.{i}.self_attn.attn._v_scale");
	}
	assert_int_equal(qkv, 1);
	assert_int_equal(k_scale, 0);
	assert_int_equal(v_scale, 1);
	tp_view_free(&v);
	const char *bad[] = {"\"vllm/nope\"", "\"/llama\"", "\"nope/llama\"", "\"vllm/llama\", \"refuse\": null",
			     "\"vllm/llama\", \"defaults\": null", "\"vllm/llama\", \"pp\": null",
			     "\"vllm/llama\", \"drop\": [\"ep\"]", "\"vllm/llama\", \"drop\": [\"pp\"], \"pp\": {}",
			     "\"vllm/llama\", \"drop\": [\"tensors\"]", "\"vllm/llama\", \"drop\": \"pp\""};
	const char *why[] = {"no built-in vllm view 'nope'", "is NAME or ENGINE/NAME", "no built-in nope view 'llama'",
			     "\"refuse\": null: a view adds", "\"defaults\": null: a view adds",
			     "\"pp\": null no longer takes an inherited field away: write \"drop\": [\"pp\"]", "\"drop\": 'ep'",
			     "\"drop\": 'pp'", "\"drop\": 'tensors'", "a list of 1 to 16 fields"};
	char t2[512];
	for (int k = 0; k < 10; k++) {
		snprintf(t2, sizeof t2, "{\"tpfs_view\": 1, \"engine\": \"other\", \"name\": \"c\", \"extends\": %s, "
			 "\"tensors\": []}", bad[k]);
		assert_int_equal(tp_view_parse(t2, strlen(t2), "c.json", &v, &e), -1);
		if (!strstr(e.msg, why[k]))
			fail_msg("%d: %s", k, e.msg);
	}
	text = "{\"tpfs_view\": 1, \"engine\": \"other\", \"name\": \"c\", \"plans\": [\"llama\"], \"drop\": [\"pp\"], "
	       "\"tensors\": []}";
	assert_int_equal(tp_view_parse(text, strlen(text), "c.json", &v, &e), -1);
	assert_non_null(strstr(e.msg, "this view extends none"));
}

/* A constant with "shape": every element the value, in the dtype (BF16 rounded to nearest); shapes
 * that are not a list of 1..4096 whole elements are refused. */
static void test_const_shape(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.o L.1.o");
	tp_vplan p;
	tp_err e;
	int rc = resolve(&f, "[{\"name\": \"L.{i}.zp\", \"const\": {\"dtype\": \"BF16\", \"value\": 0.1}, \"shape\": [2, 3], "
			 "\"per\": \"L.{i}.o\"}, {\"name\": \"L.{i}.ks\", \"const\": {\"dtype\": \"F32\", \"value\": 1.0}, "
			 "\"shape\": [1], \"per\": \"L.{i}.o\"}]", NULL, &p, &e);
	if (rc < 0)
		fail_msg("%s", e.msg);
	const tp_sdesc *z = find(&p, "L.1.zp", NULL), *k = find(&p, "L.0.ks", NULL);
	assert_non_null(z);
	assert_non_null(k);
	assert_int_equal(z->dtype, ST_BF16);
	assert_int_equal(z->ndim, 2);
	assert_int_equal(z->shape[0], 2);
	assert_int_equal(z->shape[1], 3);
	for (int j = 0; j < 6; j++) { /* 0.1f = 0x3dcccccd: BF16 0x3dcd (rounded up), not 0x3dcc (truncated) */
		uint16_t h;
		memcpy(&h, z->cbytes + 2 * j, 2);
		assert_int_equal(h, 0x3dcd);
	}
	assert_int_equal(k->ndim, 1);
	assert_int_equal(k->shape[0], 1);
	float one;
	memcpy(&one, k->cbytes, 4);
	assert_true(one == 1.0f);
	tp_vplan_free(&p);
	const char *bad[] = {"[0]", "[-1]", "[4097]", "[64, 65]", "[1.5]", "3", "[1, 1, 1, 1, 1, 1, 1, 1, 1]",
			     "[4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096]"}; /* 2^96: would wrap to 0 */
	char t[512];
	for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
		snprintf(t, sizeof t, "[{\"name\": \"c\", \"const\": {\"dtype\": \"F32\", \"value\": 1}, \"shape\": %s, "
			 "\"per\": \"L.0.o\"}]", bad[j]);
		assert_int_equal(resolve(&f, t, NULL, &p, &e), -2);
		assert_non_null(strstr(e.msg, "a constant's \"shape\""));
	}
	fx_free(&f);
}

/* A constant the dtype cannot hold (it rounds to infinity there) is refused when the view is read,
 * naming the view, the entry and the dtype's largest finite value (issue 50: 1e39 in F32 and -1e39
 * in BF16 were served as +-inf); the largest finite values, and values that round down to them,
 * are served as those values. */
static void test_const_range(void **state)
{
	(void)state;
	static const struct {
		const char *dt, *value;
		int ok;
		uint32_t bits; /* when ok */
		const char *want; /* when refused */
	} cases[] = {
		{"F32", "1e39", 0, 0, "rounds to +infinity in F32, whose largest finite value is 3.4028234663852886e38"},
		{"F32", "-1e39", 0, 0, "rounds to -infinity in F32"},
		{"F32", "1e400", 0, 0, "the constant inf rounds to +infinity in F32"}, /* a double's infinity */
		{"F32", "-1e400", 0, 0, "the constant -inf rounds to -infinity in F32"},
		{"F32", "3.4028235677973366e38", 0, 0, "rounds to +infinity in F32"}, /* FLT_MAX + half a unit: a tie, to even */
		{"F32", "3.4028234663852886e38", 1, 0x7f7fffffu, NULL}, /* FLT_MAX */
		{"F32", "3.40282356e38", 1, 0x7f7fffffu, NULL}, /* just under the tie: rounds down to FLT_MAX */
		{"BF16", "-1e39", 0, 0, "rounds to -infinity in BF16, whose largest finite value is 3.3895313892515355e38"},
		{"BF16", "3.3961775292304088e38", 0, 0, "rounds to +infinity in BF16"}, /* 0x1.ffp127: BF16's tie */
		{"BF16", "3.4e38", 0, 0, "rounds to +infinity in BF16"}, /* finite in F32, not in BF16 */
		{"BF16", "3.3895313892515355e38", 1, 0x7f7fu, NULL}, /* BF16's largest */
		{"BF16", "-3.39e38", 1, 0xff7fu, NULL},
		{"BF16", "1e-50", 1, 0x0000u, NULL}, /* underflow rounds to zero, as a cast does */
	};
	char text[512];
	for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++) {
		tp_view v;
		tp_err e;
		tp_err_clear(&e);
		snprintf(text, sizeof text,
			 "%s\"tensors\": [{\"name\": \"L.{i}.s\", \"const\": {\"dtype\": \"%s\", \"value\": %s}, "
			 "\"per\": \"L.{i}.o\"}]}", VIEW_HEAD, cases[j].dt, cases[j].value);
		int rc = tp_view_parse(text, strlen(text), "t.json", &v, &e);
		if (cases[j].ok) {
			if (rc != 0)
				fail_msg("%s %s: %s", cases[j].dt, cases[j].value, e.msg);
			if (v.e[0].cbits != cases[j].bits)
				fail_msg("%s %s: bits 0x%x, want 0x%x", cases[j].dt, cases[j].value, v.e[0].cbits, cases[j].bits);
			tp_view_free(&v);
		} else if (rc != -1 || !strstr(e.msg, "t.json: tensors[0] (L.{i}.s): the constant") ||
			   !strstr(e.msg, cases[j].want)) {
			fail_msg("%s %s: rc %d, '%s' (want '%s')", cases[j].dt, cases[j].value, rc, e.msg, cases[j].want);
		}
	}
}

/* "deinterleave": one item per piece (cat order), null or a plan expression, read into the entry (the
 * model evaluates it at the mount: tp_vcfg.dil_rows); a list of another length, an item neither null nor a
 * string, an expression that does not parse, and deinterleave on a stacked, widened or transposed entry,
 * or on a constant or a drop, are refused, naming the entry. */
static void test_deinterleave(void **state)
{
	(void)state;
	char text[768];
	tp_view v;
	tp_err e;
	snprintf(text, sizeof text, "%s\"tensors\": [{\"name\": \"L.{i}.qkv\", \"cat\": [\"L.{i}.q\", \"L.{i}.k\", "
		 "\"L.{i}.v\"], \"deinterleave\": [\"head_dim\", \"head_dim * 1\", null]}]}", VIEW_HEAD);
	if (tp_view_parse(text, strlen(text), "t.json", &v, &e) != 0)
		fail_msg("%s", e.msg);
	assert_string_equal(v.e[0].dil[0], "head_dim");
	assert_string_equal(v.e[0].dil[1], "head_dim * 1");
	assert_null(v.e[0].dil[2]);
	tp_view_free(&v);
	const char *bad[] = {
		"\"cat\": [\"L.{i}.q\", \"L.{i}.k\"], \"deinterleave\": [\"head_dim\"]",
		"\"cat\": [\"L.{i}.q\"], \"deinterleave\": [64]",
		"\"cat\": [\"L.{i}.q\"], \"deinterleave\": \"head_dim\"",
		"\"from\": \"L.{i}.q\", \"transpose\": true, \"deinterleave\": [\"head_dim\"]",
		"\"from\": \"L.{i}.q\", \"dtype\": \"F32\", \"deinterleave\": [\"head_dim\"]",
		"\"cat\": [\"L.{i}.{e}.q\"], \"stack\": \"e\", \"deinterleave\": [\"head_dim\"]",
		"\"cat\": [\"L.{i}.q\"], \"deinterleave\": [\"head_dim +\"]",
		"\"const\": {\"dtype\": \"F32\", \"value\": 1}, \"per\": \"L.{i}.q\", \"deinterleave\": [\"head_dim\"]",
	};
	const char *why[] = {"one item per piece", "one item per piece", "one item per piece", "one item per piece",
			     "one item per piece", "one item per piece", "\"deinterleave\"[0]", "are for cat and from entries"};
	for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
		snprintf(text, sizeof text, "%s\"tensors\": [{\"name\": \"L.{i}.x\", %s}]}", VIEW_HEAD, bad[j]);
		tp_err_clear(&e);
		if (tp_view_parse(text, strlen(text), "t.json", &v, &e) != -1 || !strstr(e.msg, "t.json: tensors[0]") ||
		    !strstr(e.msg, why[j]))
			fail_msg("bad[%zu]: '%s' (want '%s')", j, e.msg, why[j]);
	}
}

/* "transpose": true and "other_ranks": "zeros" reach the served tensor's description; a transpose of
 * several pieces or with widening, a non-boolean transpose and another other_ranks are refused. */
static void test_transpose_rank0(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.o L.0.b L.1.o L.1.b");
	tp_vplan p;
	tp_err e;
	int rc = resolve(&f, "[{\"name\": \"L.{i}.w\", \"from\": \"L.{i}.o\", \"transpose\": true}, "
			 "{\"name\": \"L.{i}.bias\", \"from\": \"L.{i}.b\", \"other_ranks\": \"zeros\"}]", NULL, &p, &e);
	if (rc < 0)
		fail_msg("%s", e.msg);
	const tp_sdesc *w = find(&p, "L.1.w", NULL), *b = find(&p, "L.0.bias", NULL);
	assert_non_null(w);
	assert_non_null(b);
	assert_true(w->transpose && !w->rank0_only);
	assert_true(b->rank0_only && !b->transpose);
	tp_vplan_free(&p);
	const char *bad[] = {"\"cat\": [\"L.0.o\", \"L.0.b\"], \"transpose\": true",
			     "\"from\": \"L.0.o\", \"transpose\": true, \"dtype\": \"F32\"",
			     "\"from\": \"L.0.o\", \"transpose\": 1", "\"from\": \"L.0.o\", \"other_ranks\": \"ones\""};
	const char *why[] = {"takes one \"from\" piece", "takes one \"from\" piece", "is true or false", "is \"zeros\""};
	/* not on const or drop entries */
	const char *odd[] = {"[{\"name\": \"c\", \"const\": {\"dtype\": \"F32\", \"value\": 1}, \"per\": \"L.0.o\", "
			     "\"other_ranks\": \"zeros\"}]", "[{\"drop\": \"L.0.o\", \"transpose\": true}]"};
	for (size_t j = 0; j < 2; j++) {
		assert_int_equal(resolve(&f, odd[j], NULL, &p, &e), -2);
		if (!strstr(e.msg, "are for cat and from entries"))
			fail_msg("odd[%zu]: %s", j, e.msg);
	}
	char t[512];
	for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
		snprintf(t, sizeof t, "[{\"name\": \"c\", %s}]", bad[j]);
		assert_int_equal(resolve(&f, t, NULL, &p, &e), -2);
		if (!strstr(e.msg, why[j]))
			fail_msg("bad[%zu]: %s", j, e.msg);
	}
	fx_free(&f);
}

/* "include": built-in fragments put over the parent (or an empty view) before the file: their
 * entries (a file's entry of the same name replaces one), their refusals appended to the parent's
 * and the file's, defaults merged by key; a fragment is never chosen nor mounted, holds no view
 * fields, neither extends nor includes; a missing fragment, a view named as one, and a list that
 * is not one are refused. */
/* --pp: the layers of each stage as vLLM's get_pp_indices divides them (distributed/utils.py: n / P
 * each, the remainder one each to the stages before the last, counted back from it), --pp-layers'
 * own division, and the refusals */
static void test_pp_partition(void **state)
{
	(void)state;
	struct {
		uint64_t n;
		uint32_t P;
		uint64_t want[5];
	} cases[] = {{2, 2, {0, 1, 2}}, {3, 2, {0, 2, 3}}, {7, 3, {0, 2, 5, 7}}, {4, 3, {0, 1, 3, 4}},
		     {61, 4, {0, 15, 30, 46, 61}}, {5, 1, {0, 5}}, {8, 4, {0, 2, 4, 6, 8}}};
	uint64_t start[TP_PP_MAX + 1];
	tp_err e;
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		assert_int_equal(tp_pp_partition(cases[c].n, cases[c].P, NULL, start, &e), 0);
		for (uint32_t s = 0; s <= cases[c].P; s++)
			assert_int_equal(start[s], cases[c].want[s]);
	}
	const uint32_t given[3] = {1, 2, 4};
	assert_int_equal(tp_pp_partition(7, 3, given, start, &e), 0);
	assert_int_equal(start[1], 1);
	assert_int_equal(start[2], 3);
	assert_int_equal(start[3], 7);
	assert_int_equal(tp_pp_partition(8, 3, given, start, &e), -1); /* 7 layers given for 8 */
	assert_non_null(strstr(e.msg, "hold 7 layers where config.json has 8"));
	assert_int_equal(tp_pp_partition(2, 3, NULL, start, &e), -1); /* a stage without a layer */
	assert_non_null(strstr(e.msg, "would hold no layer"));
	assert_int_equal(tp_pp_partition(2, TP_PP_MAX + 1, NULL, start, &e), -1);
}

/* the stage of a tensor under a view's "pp": by layer, first, last, every; anything else refused by
 * name; a malformed "pp" refused */
static void test_pp_stage(void **state)
{
	(void)state;
	tp_view v;
	tp_err e;
	const char *text = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"s\", \"plans\": [\"llama\"], "
			   "\"pp\": {\"layers\": \"model.layers.\", \"count\": \"num_hidden_layers\", "
			   "\"first\": [\"model.embed_tokens.\"], \"last\": [\"model.norm.\"], \"every\": [\"lm_head.\"], "
			   "\"model_types\": [\"llama\"]}, \"tensors\": []}";
	assert_int_equal(tp_view_parse(text, strlen(text), "s.json", &v, &e), 0);
	uint64_t start[4];
	assert_int_equal(tp_pp_partition(7, 3, NULL, start, &e), 0); /* [0, 2), [2, 5), [5, 7) */
	assert_int_equal(tp_view_stage(&v, "model.layers.1.mlp.down_proj.weight", 3, start, &e), 0);
	assert_int_equal(tp_view_stage(&v, "model.layers.2.self_attn.qkv_proj.weight", 3, start, &e), 1);
	assert_int_equal(tp_view_stage(&v, "model.layers.6.mlp.experts.routed_experts.w13_weight", 3, start, &e), 2);
	assert_int_equal(tp_view_stage(&v, "model.embed_tokens.weight", 3, start, &e), 0);
	assert_int_equal(tp_view_stage(&v, "model.norm.weight", 3, start, &e), 2);
	assert_int_equal(tp_view_stage(&v, "lm_head.weight", 3, start, &e), TP_PP_EVERY);
	assert_int_equal(tp_view_stage(&v, "model.layers.7.mlp.down_proj.weight", 3, start, &e), -1);
	assert_non_null(strstr(e.msg, "layer 7, past the 7 layers"));
	assert_int_equal(tp_view_stage(&v, "model.rotary.inv_freq", 3, start, &e), -1);
	assert_non_null(strstr(e.msg, "tensor 'model.rotary.inv_freq': which pipeline stage holds it is not known"));
	assert_int_equal(tp_view_stage(&v, "model.layers.x.weight", 3, start, &e), -1); /* not a layer number */
	tp_view_free(&v);
	const char *bad[] = {"\"pp\": {\"layers\": \"model.layers.\", \"count\": \"n\", \"first\": [], \"last\": []}",
			     "\"pp\": {\"layers\": \"\", \"count\": \"n\", \"first\": [], \"last\": [], \"model_types\": [\"a\"]}",
			     "\"pp\": {\"layers\": \"l.\", \"count\": \"n\", \"first\": [\"\"], \"last\": [], \"model_types\": [\"a\"]}",
			     "\"pp\": {\"layers\": \"l.\", \"count\": \"n\", \"first\": [], \"last\": [], \"model_types\": [\"a\"], \"x\": 1}",
			     "\"pp\": [1]"};
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		char t[512];
		snprintf(t, sizeof t, "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"s\", \"plans\": [\"llama\"], %s, "
			 "\"tensors\": []}", bad[k]);
		assert_int_equal(tp_view_parse(t, strlen(t), "s.json", &v, &e), -1);
		assert_non_null(strstr(e.msg, "\"pp\" is {"));
	}
}

static void test_include(void **state)
{
	(void)state;
	tp_view v;
	tp_err e;
	const char *text = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"q\", \"plans\": [\"llama\"], "
			   "\"quant_methods\": [\"fp8\"], \"include\": [\"fp8_block\", \"fp8_attention\"], "
			   "\"refuse\": [{\"if\": \"T > 8\", \"reason\": \"mine\"}], \"tensors\": [{\"name\": "
			   "\"model.layers.{i}.self_attn.attn.q_scale\", \"const\": {\"dtype\": \"F32\", \"value\": 2}, "
			   "\"per\": \"model.layers.{i}.self_attn.o_proj.weight\"}]}";
	assert_int_equal(tp_view_parse(text, strlen(text), "q.json", &v, &e), 0);
	assert_false(v.fragment);
	assert_int_equal(v.ne, 6); /* qkv and gate_up scales, four KV-cache scales (q_scale replaced) */
	int q = -1;
	for (size_t k = 0; k < v.ne; k++)
		if (v.e[k].name && !strcmp(v.e[k].name, "model.layers.{i}.self_attn.attn.q_scale"))
			q = (int)k;
	assert_true(q >= 0 && v.e[q].cdtype == ST_F32 && v.e[q].cbits == 0x40000000u); /* 2.0f */
	assert_int_equal(cJSON_GetArraySize(v.refuse), 6); /* the fragment's five, then this file's */
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(v.refuse, 5), "reason")->valuestring,
			    "mine");
	tp_view_free(&v);
	/* over a parent: the parent's defaults kept beside the file's, refusals accumulated */
	text = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"c\", \"extends\": \"llama_fp8\", "
	       "\"defaults\": {\"x\": 3}, \"refuse\": [{\"if\": \"T > 8\", \"reason\": \"mine\"}], \"tensors\": []}";
	assert_int_equal(tp_view_parse(text, strlen(text), "c.json", &v, &e), 0);
	assert_int_equal(cJSON_GetArraySize(v.refuse), 6);
	assert_non_null(cJSON_GetObjectItemCaseSensitive(v.defaults, "x"));
	assert_non_null(cJSON_GetObjectItemCaseSensitive(v.defaults, "tie_word_embeddings"));
	tp_view_free(&v);
	/* a fragment parses, is skipped by the built-in choice and refused as a mounted view */
	size_t l = 0;
	const char *ft = NULL;
	for (int i = 0; i < tp_view_builtin_count() && !ft; i++) {
		const char *t = tp_view_builtin_text(i, &l);
		if (strstr(t, "\"name\": \"fp8_block\""))
			ft = t;
	}
	assert_non_null(ft);
	assert_int_equal(tp_view_parse(ft, l, "fp8_block", &v, &e), 0);
	assert_true(v.fragment);
	tp_view_free(&v);
	assert_int_equal(tp_view_choose("vllm", ft, l, "llama", "llama", "fp8", &v, &e), -1);
	assert_non_null(strstr(e.msg, "is a fragment"));
	assert_int_equal(tp_view_choose("vllm", NULL, 0, "llama", "llama", "fp8", &v, &e), 0);
	assert_string_equal(v.name, "llama_fp8");
	tp_view_free(&v);
	/* a fragment's {"drop": {"entry": NAME}} takes the parent's entry away where it is included (SGLang's
	 * attention fragment: vLLM's four scale buffers), and one that takes nothing is refused there */
	text = "{\"tpfs_view\": 1, \"engine\": \"sglang\", \"name\": \"s\", \"extends\": \"vllm/llama\", "
	       "\"include\": [\"attention\"], \"tensors\": []}";
	assert_int_equal(tp_view_parse(text, strlen(text), "s.json", &v, &e), 0);
	for (size_t k = 0; k < v.ne; k++)
		assert_true(!v.e[k].name || !strstr(v.e[k].name, "attn._"));
	tp_view_free(&v);
	text = "{\"tpfs_view\": 1, \"engine\": \"sglang\", \"name\": \"s\", \"plans\": [\"llama\"], "
	       "\"include\": [\"attention\"], \"tensors\": []}";
	assert_int_equal(tp_view_parse(text, strlen(text), "s.json", &v, &e), -1);
	assert_non_null(strstr(e.msg, "takes away the entry"));
	const char *bad[] = {"\"include\": [\"nope\"]", "\"include\": [\"llama\"]", "\"include\": \"fp8_block\"",
			     "\"include\": []", "\"include\": [3]", "\"fragment\": true, \"plans\": [\"llama\"]",
			     "\"fragment\": true, \"include\": [\"fp8_block\"]"};
	const char *why[] = {"no built-in vllm fragment 'nope'", "no built-in vllm fragment 'llama'",
			     "a list of 1 to 16", "a list of 1 to 16", "holds fragment names", "not the field 'plans'",
			     "neither extends"};
	char t2[512];
	for (int k = 0; k < 7; k++) {
		snprintf(t2, sizeof t2, "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"c\", %s, \"plans\": [\"llama\"], "
			 "\"tensors\": []}", bad[k]);
		if (k >= 5) /* a fragment: its own fields only */
			snprintf(t2, sizeof t2, "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"c\", %s, \"tensors\": []}",
				 bad[k]);
		assert_int_equal(tp_view_parse(t2, strlen(t2), "c.json", &v, &e), -1);
		if (!strstr(e.msg, why[k]))
			fail_msg("%d: %s", k, e.msg);
	}
}

/* Fragments that take parameters: "params" (a default, or null: required), given by an include's
 * {"fragment": NAME, "with": {...}} and put into every string of the fragment's entries. */
static void test_fragment_params(void **state)
{
	(void)state;
	tp_view v;
	tp_err e;
	char t[1024];
	const char *head = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"p\", \"plans\": [\"llama\"], ";
	snprintf(t, sizeof t, "%s\"include\": [{\"fragment\": \"attention_scales\", \"with\": {\"attn\": \"L.{i}.a\", "
		 "\"per\": \"L.{i}.o\"}}, {\"fragment\": \"experts\", \"with\": {\"w\": \"weight_scale_inv\"}}, \"mlp\", "
		 "{\"fragment\": \"mlp\", \"with\": {\"src\": \"S.{i}\", \"dst\": \"D.{i}\"}}], \"tensors\": []}", head);
	if (tp_view_parse(t, strlen(t), "p.json", &v, &e) < 0)
		fail_msg("%s", e.msg);
	assert_int_equal(v.ne, 4 + 2 + 2 + 2); /* four scales, a stack pair, two mlps of two entries */
	assert_string_equal(v.e[0].name, "L.{i}.a._k_scale");
	assert_string_equal(v.e[3].name, "L.{i}.a._prob_scale");
	assert_string_equal(v.e[3].per, "L.{i}.o");
	assert_string_equal(v.e[4].name, "model.layers.{i}.mlp.experts.routed_experts.w13_weight_scale_inv"); /* defaults */
	assert_string_equal(v.e[4].cat[1], "model.layers.{i}.mlp.experts.{e}.up_proj.weight_scale_inv");
	assert_string_equal(v.e[6].name, "model.layers.{i}.mlp.gate_up_proj.weight");
	assert_string_equal(v.e[8].name, "D.{i}.gate_up_proj.weight"); /* the same fragment again, other params */
	assert_string_equal(v.e[9].cat[0], "S.{i}.down_proj.weight");
	tp_view_free(&v);
	const char *bad[] = {"\"attention_scales\"", "{\"fragment\": \"attention_scales\", \"with\": {\"attn\": \"a\"}}",
			     "{\"fragment\": \"mlp\", \"with\": {\"src\": \"a\", \"zz\": \"b\"}}",
			     "{\"fragment\": \"mlp\", \"with\": {\"src\": 3}}", "{\"fragment\": \"mlp\", \"w\": \"x\"}",
			     "{\"with\": {}}"};
	const char *why[] = {"parameter 'attn' is required", "parameter 'per' is required", "'zz' is not one of its",
			     "'src' is not one of its", "or {\"fragment\"", "or {\"fragment\""};
	for (int k = 0; k < 6; k++) {
		snprintf(t, sizeof t, "%s\"include\": [%s], \"tensors\": []}", head, bad[k]);
		assert_int_equal(tp_view_parse(t, strlen(t), "p.json", &v, &e), -1);
		if (!strstr(e.msg, why[k]))
			fail_msg("%d: %s", k, e.msg);
	}
	/* a fragment read alone: its required parameters stand for their names; a ${X} that names no
	 * parameter, and params that are not an object of strings and nulls, are refused */
	const char *frag = "{\"tpfs_view\": 1, \"engine\": \"vllm\", \"name\": \"f\", \"fragment\": true, %s \"tensors\": "
			   "[{\"name\": \"${a}.x\", \"from\": \"${b}.y\"}]}";
	const char *fp[] = {"\"params\": {\"a\": null, \"b\": \"B\"},", "\"params\": {\"a\": null},",
			    "\"params\": {\"a\": 1, \"b\": null},", "\"params\": [\"a\", \"b\"],"};
	for (int k = 0; k < 4; k++) {
		snprintf(t, sizeof t, frag, fp[k]);
		int rc = tp_view_parse(t, strlen(t), "f.json", &v, &e);
		if (k == 0) {
			assert_int_equal(rc, 0);
			assert_string_equal(v.e[0].name, "a.x");
			assert_string_equal(v.e[0].cat[0], "B.y");
			tp_view_free(&v);
			continue;
		}
		assert_int_equal(rc, -1);
		if (!strstr(e.msg, k == 1 ? "${b}.y names no parameter" : k == 2 ? "its default is a string" : "\"params\" is an object"))
			fail_msg("%d: %s", k, e.msg);
	}
}

/* "rename": the tensors no entry uses under a prefix (those its names take, or every one) served
 * under another prefix, keep_rest or not; the rest kept or refused by keep_rest. */
static void test_rename(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "P.0.a P.0.b P.1.a P.1.c Q.x");
	tp_vplan p;
	tp_err e;
	const char *ren = "\"rename\": [{\"from\": \"P.\", \"to\": \"R.\", \"names\": [\"{i}.a\", \"1.c\"]}], ";
	char extra[512];
	snprintf(extra, sizeof extra, "%s\"keep_rest\": false, ", ren);
	assert_int_equal(resolve(&f, "[{\"name\": \"Q\", \"from\": \"Q.x\"}]", extra, &p, &e), -1);
	assert_non_null(strstr(e.msg, "tensor 'P.0.b'")); /* not among the names: refused, keep_rest off */
	assert_non_null(strstr(e.msg, "no \"rename\" takes it"));
	snprintf(extra, sizeof extra, "%s", ren);
	if (resolve(&f, "[{\"name\": \"X\", \"from\": \"P.1.a\"}]", extra, &p, &e) < 0)
		fail_msg("%s", e.msg);
	assert_non_null(find(&p, "R.0.a", NULL));
	assert_non_null(find(&p, "R.1.c", NULL));
	assert_non_null(find(&p, "P.0.b", NULL)); /* kept under its own name */
	assert_non_null(find(&p, "X", NULL));     /* an entry's piece is the entry's, not renamed */
	assert_null(find(&p, "R.1.a", NULL));
	assert_null(find(&p, "P.0.a", NULL));
	assert_int_equal(p.ntensors, 5);
	tp_vplan_free(&p);
	/* no names: every tensor under the prefix; the first pair that takes a name wins */
	if (resolve(&f, "[]", "\"rename\": [{\"from\": \"P.1.\", \"to\": \"S.\"}, {\"from\": \"P.\", \"to\": \"\"}], "
		    "\"keep_rest\": false, \"tensors_unused\": 0, ", &p, &e) != -2)
		fail_msg("an unknown field is refused");
	if (resolve(&f, "[{\"name\": \"Q\", \"from\": \"Q.x\"}]",
		    "\"rename\": [{\"from\": \"P.1.\", \"to\": \"S.\"}, {\"from\": \"P.\", \"to\": \"\"}], \"keep_rest\": false, ",
		    &p, &e) < 0)
		fail_msg("%s", e.msg);
	assert_non_null(find(&p, "S.a", NULL));
	assert_non_null(find(&p, "S.c", NULL));
	assert_non_null(find(&p, "0.a", NULL));
	assert_non_null(find(&p, "0.b", NULL));
	tp_vplan_free(&p);
	/* a renamed tensor that meets another served name is refused as any served name made twice */
	assert_int_equal(resolve(&f, "[{\"name\": \"R.0.b\", \"from\": \"Q.x\"}]",
				 "\"rename\": [{\"from\": \"P.\", \"to\": \"R.\"}], ", &p, &e), -1);
	assert_non_null(strstr(e.msg, "'R.0.b' is made twice"));
	const char *bad[] = {"[[\"P.\", \"R.\"]]", "[{\"from\": \"\", \"to\": \"R.\"}]", "[{\"from\": \"P.{i}\", \"to\": \"R.\"}]",
			     "[{\"from\": \"P.\", \"to\": \"R.\", \"names\": []}]", "[{\"from\": \"P.\", \"to\": \"R.\", \"x\": 1}]",
			     "[{\"from\": \"P.\", \"to\": \"R.\", \"names\": [\"{i\"]}]", "[]"};
	for (int k = 0; k < 7; k++) {
		snprintf(extra, sizeof extra, "\"rename\": %s, ", bad[k]);
		assert_int_equal(resolve(&f, "[]", extra, &p, &e), -2);
		if (!strstr(e.msg, "\"rename\": a list of 1 to 16"))
			fail_msg("%d: %s", k, e.msg);
	}
	fx_free(&f);
}

static void test_stack(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.e.0.g L.0.e.0.u L.0.e.1.g L.0.e.1.u L.0.e.2.g L.0.e.2.u L.0.e.10.g L.0.e.10.u");
	tp_vplan p;
	tp_err e;
	const char *view = "[{\"name\": \"L.{i}.w13\", \"stack\": \"x\", \"cat\": [\"L.{i}.e.{x}.g\", \"L.{i}.e.{x}.u\"]}]";
	/* experts 0, 1, 2 and 10: 3..9 are missing */
	assert_int_equal(resolve(&f, view, NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "x = 3 is missing"));
	fx_free(&f);
	fixture g = {0};
	fx_add(&g, "L.0.e.0.g L.0.e.0.u L.0.e.1.g L.0.e.1.u L.0.e.2.g L.0.e.2.u L.0.e.3.g L.0.e.3.u L.1.e.0.g L.1.e.0.u");
	assert_int_equal(resolve(&g, view, NULL, &p, &e), 0);
	size_t part;
	const tp_sdesc *d = find(&p, "L.0.w13", &part);
	assert_non_null(d);
	assert_int_equal(d->nstack, 4);
	assert_int_equal(d->npieces, 2);
	assert_string_equal(piece_name(&g, &p, part, &d->pieces[2 * 3 + 1]), "L.0.e.3.u"); /* group 3, piece 1 */
	d = find(&p, "L.1.w13", NULL);
	assert_non_null(d);
	assert_int_equal(d->nstack, 1);
	tp_vplan_free(&p);
	fx_free(&g);
}

static void test_parts_and_sources(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.q:8 L.0.o");
	fx_add(&f, "L.0.k:4 L.0.v:4");
	fx_add(&f, "L.1.q:8 L.1.k:4 L.1.v:4");
	tp_vplan p;
	tp_err e;
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.qkv\", \"cat\": [\"L.{i}.q\", \"L.{i}.k\", \"L.{i}.v\"]}]", NULL, &p,
				 &e), 0);
	/* file b's tensors all went into file a's qkv: two parts, a's reading a and b */
	assert_int_equal(p.nparts, 2);
	assert_int_equal(p.parts[0].file, 0);
	assert_int_equal(p.parts[0].nsrc, 2);
	assert_int_equal(p.parts[0].srcs[0], 0);
	assert_int_equal(p.parts[0].srcs[1], 1);
	assert_int_equal(p.parts[1].file, 2);
	assert_int_equal(p.parts[1].nsrc, 1);
	size_t part;
	const tp_sdesc *d = find(&p, "L.0.qkv", &part);
	assert_int_equal(part, 0);
	assert_int_equal(d->pieces[0].file, 0);
	assert_int_equal(d->pieces[1].file, 1); /* local index of file b in part 0's table */
	assert_string_equal(piece_name(&f, &p, part, &d->pieces[1]), "L.0.k");
	d = find(&p, "L.1.qkv", &part);
	assert_int_equal(d->pieces[2].file, 0); /* file c is source 0 of its own part */
	tp_vplan_free(&p);
	fx_free(&f);
}

static void test_refusals(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.q:8 L.0.k:4 L.1.q:8 embed:16");
	tp_vplan p;
	tp_err e;
	const char *cat = "[{\"name\": \"L.{i}.qkv\", \"cat\": [\"L.{i}.q\", \"L.{i}.k\", \"L.{i}.v\"]}]";
	assert_int_equal(resolve(&f, cat, NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "source tensor 'L.0.v' is missing"));
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.qkv\", \"if\": \"tensor('L.{i}.k') && tensor('L.{i}.v')\", "
				 "\"cat\": [\"L.{i}.q\", \"L.{i}.k\", \"L.{i}.v\"]}]", NULL, &p, &e), 0);
	assert_null(find(&p, "L.0.qkv", NULL));
	assert_non_null(find(&p, "L.0.q", NULL)); /* skipped entries leave their tensors to keep_rest */
	tp_vplan_free(&p);
	/* two entries making one name */
	assert_int_equal(resolve(&f, "[{\"name\": \"x\", \"from\": \"embed\"}, {\"name\": \"x\", \"from\": \"L.1.q\"}]", NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "'x' is made twice"));
	/* a name that binds fewer variables than its pieces */
	assert_int_equal(resolve(&f, "[{\"name\": \"all_q\", \"from\": \"L.{i}.q\"}]", NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "is made 2 times"));
	/* a tensor used twice */
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\"}, {\"name\": \"b\", \"cat\": [\"embed\"]}]", NULL, &p, &e), -1);
	assert_non_null(strstr(e.msg, "'embed' is used by two entries"));
	/* keep_rest off: an unused tensor is named */
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\"}]", "\"keep_rest\": false, ", &p, &e), -1);
	assert_non_null(strstr(e.msg, "tensor 'L.0.k'"));
	/* parse errors */
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"L.{i}{j}\"}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "side by side"));
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"form\": \"embed\"}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "unknown field 'form'"));
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\", \"drop\": \"x\"}]", NULL, &p, &e), -2);
	assert_int_equal(resolve(&f, "[{\"name\": \"s\", \"const\": {\"dtype\": \"I8\", \"value\": 1}, \"per\": \"embed\"}]", NULL,
				 &p, &e), -2);
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{x}.w\", \"stack\": \"x\", \"cat\": [\"L.{x}.q\"]}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "not in the served name"));
	/* conditions are plan expressions, parsed with the view: a syntax error and an empty one are
	 * refused; a variable name past 31 characters, five variables: refused (each would
	 * have left its entry silently off or never matching) */
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\", \"if\": \"model_type == 'x'\"}]", NULL,
				 &p, &e), 0);
	tp_vplan_free(&p);
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\", \"if\": \"!(tie word)\"}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "\"if\": expression '!(tie word)'"));
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\", \"if\": \"\"}]", NULL, &p, &e), -2);
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\", \"if\": 3}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "\"if\" is a plan expression"));
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\", \"if\": \"!tie_2 && T > 1\"}]", NULL, &p, &e),
			 0);
	tp_vplan_free(&p);
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{abcdefghijabcdefghijabcdefghij12}.w\", "
				 "\"from\": \"L.{abcdefghijabcdefghijabcdefghij12}.q\"}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "at most 31 characters"));
	assert_int_equal(resolve(&f, "[{\"name\": \"{a}.{b}.{c}.{d}.{x}\", \"from\": \"{a}.{b}.{c}.{d}.{x}\"}]", NULL, &p, &e),
			 -2);
	assert_non_null(strstr(e.msg, "at most 4 variables"));
	/* "defaults": config keys and true, false or a number */
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\"}]", "\"defaults\": {\"tie\": \"yes\"}, ", &p, &e), -2);
	assert_non_null(strstr(e.msg, "\"defaults\""));
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\"}]", "\"defaults\": [true], ", &p, &e), -2);
	/* "drop_layers" is refused, naming the drop entry that replaced it */
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\"}]",
				 "\"drop_layers\": {\"prefix\": \"L.\", \"from\": \"n\"}, ", &p, &e), -2);
	assert_non_null(strstr(e.msg, "'drop_layers' is no longer a view keyword: write the tensors entry {\"drop\": "
				      "\"PREFIX{n}.*\", \"if\": \"n >= KEY\"}"));
	assert_int_equal(resolve(&f, "[{\"name\": \"a\", \"from\": \"embed\"}]", "\"defaults\": {\"tie\": true}, ", &p, &e), 0);
	tp_vplan_free(&p);
	fx_free(&f);
}

/* "reshape": parsed into the entry's served descriptions (served.c applies it: test_served), and its
 * refusals: not a list, a dimension below 0 other than -1, two -1, a fraction, more than
 * ST_MAX_DIMS. A 0 is kept (the tensor's own dimension at that axis, served.c). */
static void test_shape(void **state)
{
	(void)state;
	fixture f = {0};
	fx_add(&f, "L.0.a:8 L.1.a:8");
	tp_vplan p;
	tp_err e;
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.A\", \"from\": \"L.{i}.a\", \"reshape\": [1, 1, -1, 1]}]", NULL, &p, &e),
			 0);
	const tp_sdesc *d = find(&p, "L.1.A", NULL);
	assert_non_null(d);
	assert_int_equal(d->rs_ndim, 4);
	assert_int_equal(d->rs_shape[0], 1);
	assert_int_equal(d->rs_shape[2], -1);
	assert_int_equal(d->rs_shape[3], 1);
	tp_vplan_free(&p);
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.A\", \"from\": \"L.{i}.a\"}]", NULL, &p, &e), 0);
	assert_int_equal(find(&p, "L.0.A", NULL)->rs_ndim, 0); /* no "reshape": the pieces' */
	tp_vplan_free(&p);
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.A\", \"from\": \"L.{i}.a\", \"reshape\": [0, -1]}]", NULL, &p, &e), 0);
	assert_int_equal(find(&p, "L.0.A", NULL)->rs_shape[0], 0);
	tp_vplan_free(&p);
	const char *bad[] = {"2", "[]", "[-3, 4]", "[-2, 4]", "[-1, -1]", "[1.5, 2]", "[\"4\"]", "[1, 1, 1, 1, 1, 1, 1, 1, 1]"};
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		char t[256];
		snprintf(t, sizeof t, "[{\"name\": \"L.{i}.A\", \"from\": \"L.{i}.a\", \"reshape\": %s}]", bad[k]);
		assert_int_equal(resolve(&f, t, NULL, &p, &e), -2);
		if (!strstr(e.msg, "\"reshape\" is a list of 1 to 8 dimensions"))
			fail_msg("shape %s: '%s'", bad[k], e.msg);
	}
	/* "shape" is a constant's own shape only: on a from entry it is refused, naming "reshape";
	 * "reshape" on a constant is refused, naming "shape" */
	assert_int_equal(resolve(&f, "[{\"name\": \"L.{i}.A\", \"from\": \"L.{i}.a\", \"shape\": [-1]}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "\"shape\" on a cat / from entry is now \"reshape\""));
	assert_int_equal(resolve(&f, "[{\"name\": \"c\", \"const\": {\"dtype\": \"F32\", \"value\": 1}, \"reshape\": [1], "
				 "\"per\": \"L.{i}.a\"}]", NULL, &p, &e), -2);
	assert_non_null(strstr(e.msg, "a constant's shape is \"shape\""));
	fx_free(&f);
}

static void test_choose(void **state)
{
	(void)state;
	tp_view v;
	tp_err e;
	assert_int_equal(tp_view_choose("vllm", NULL, 0, "llama", "llama", NULL, &v, &e), 0);
	assert_string_equal(v.name, "llama");
	assert_int_equal(v.pad_vocab, 64);
	tp_view_free(&v);
	assert_int_equal(tp_view_choose("vllm", NULL, 0, "kda", "kimi_linear", NULL, &v, &e), 0);
	assert_string_equal(v.name, "kimi_linear");
	tp_view_free(&v);
	/* a plan whose views list other model types */
	assert_int_equal(tp_view_choose("vllm", NULL, 0, "qwen3-next", "qwen3_5", NULL, &v, &e), -1);
	assert_non_null(strstr(e.msg, "no vllm view for plan 'qwen3-next' with model_type 'qwen3_5'"));
	assert_non_null(strstr(e.msg, "hf view"));
	assert_int_equal(tp_view_choose("sglang", NULL, 0, "llama", "llama", NULL, &v, &e), 0);
	assert_string_equal(v.engine, "sglang");
	tp_view_free(&v);
	assert_int_equal(tp_view_choose("trtllm", NULL, 0, "llama", "llama", NULL, &v, &e), -1);
	assert_non_null(strstr(e.msg, "no view for that engine (it has: "));
	assert_non_null(strstr(e.msg, "vllm"));
	assert_non_null(strstr(e.msg, "sglang"));
	/* every built-in view parses */
	for (int i = 0; i < tp_view_builtin_count(); i++) {
		size_t len;
		const char *t = tp_view_builtin_text(i, &len);
		if (tp_view_parse(t, len, "built-in", &v, &e) < 0)
			fail_msg("built-in view %d: %s", i, e.msg);
		tp_view_free(&v);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cat_const_rename), cmocka_unit_test(test_if_tensor), cmocka_unit_test(test_if), cmocka_unit_test(test_old_keywords), cmocka_unit_test(test_drop), cmocka_unit_test(test_refuse_proven_parse), cmocka_unit_test(test_extends), cmocka_unit_test(test_extends_engine),
		cmocka_unit_test(test_stack),            cmocka_unit_test(test_parts_and_sources),
		cmocka_unit_test(test_refusals),         cmocka_unit_test(test_choose),
		cmocka_unit_test(test_shape),            cmocka_unit_test(test_const_shape), cmocka_unit_test(test_const_range),
		cmocka_unit_test(test_include),          cmocka_unit_test(test_rules),
		cmocka_unit_test(test_fragment_params),  cmocka_unit_test(test_rename),
		cmocka_unit_test(test_pp_partition),
		cmocka_unit_test(test_transpose_rank0),
		cmocka_unit_test(test_deinterleave),
		cmocka_unit_test(test_pp_stage),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
