/* model.c: validating and planning a source checkpoint (see model.h), over the source tree
 * (srctree.h) and, under --view, the engine view's two steps (model_view.h), each handed what it
 * reads; and the accessors the front ends reach the served files through. */
#include "model.h"
#include "slurp.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index_json.h"
#include "json_strict.h"
#include "tensor_index.h"

/* Reads and parses the JSON file of node n; NULL with e set when it cannot (duplicate keys
 * included: tp_json_unique). With keep, the text
 * read is handed over in *keep (its length in *keep_len) instead of freed. */
static cJSON *parse_json_file(const tp_node *n, char **keep, size_t *keep_len, tp_err *e)
{
	size_t len;
	char *text = tp_slurp(n->abspath, n->path, NULL, &len, e);
	if (!text)
		return NULL;
	cJSON *j = tp_json_parse(n->path, text, len, e); /* as Python's json reads it (json_strict.h) */
	if (j && keep) {
		*keep = text;
		*keep_len = len;
	} else {
		free(text);
	}
	return j;
}

/* Marks the tensor files an index lists as needed. */
static void mark_needed(tp_model *m, uint32_t idx, const cJSON *j)
{
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *it;
	cJSON_ArrayForEach(it, wm)
	{
		if (!cJSON_IsString(it))
			continue;
		uint32_t f = tp_node_resolve(&m->tree, m->tree.n[idx].parent, it->valuestring);
		if (f != UINT32_MAX)
			m->tree.n[f].needed = 1;
	}
}

/* Opens, maps and validates one safetensors file. Returns 0, or -1 with e set. */
static int load_tensors(tp_model *m, tp_node *n, tp_err *e)
{
	struct stat st; /* opened never waiting (a FIFO put there since the walk stat()ed it is refused) */
	n->fd = tp_open_regular(n->real, n->path, NULL, &st, e);
	if (n->fd < 0 && e->code == TP_EIO && (errno == EMFILE || errno == ENFILE)) {
		int err = errno;
		uint32_t files = 0;
		for (uint32_t i = 0; i < m->tree.nn; i++)
			files += m->tree.n[i].kind == TN_TENSORS;
		struct rlimit rl = {0, 0};
		getrlimit(RLIMIT_NOFILE, &rl);
		return tp_fail(e, TP_ELIMIT, "%s: cannot open: %s: the checkpoint has %u safetensors files, each held "
			       "open, and the open-file limit is %llu (hard limit %llu): raise the hard limit (ulimit -Hn)",
			       n->path, strerror(err), files, (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
	}
	if (n->fd < 0)
		return -1;
	n->src_size = (uint64_t)st.st_size;
	n->mtime = st.st_mtim;
	n->ctime = st.st_ctim;
	n->dev = st.st_dev;
	n->ino = st.st_ino;
	n->mode = st.st_mode;
	n->uid = st.st_uid;
	n->gid = st.st_gid;
	/* The header alone, without the kernel's readahead past it: that would bring in megabytes of
	 * tensor data (other ranks' rows, on a node that serves some ranks) at every mount, plan and
	 * check (issue 52). The advice is the open file's, and the daemon reads through this
	 * descriptor's mapping later: its reads get their own policy (fs_read.c, --source-io), so the
	 * default is restored after the header. A file system without the advice reads as before. */
	posix_fadvise(n->fd, 0, 0, POSIX_FADV_RANDOM);
	int hrc = st_read_fd(n->fd, n->src_size, n->path, &n->h, e);
	posix_fadvise(n->fd, 0, 0, POSIX_FADV_NORMAL);
	if (hrc < 0)
		return -1;
	if (n->src_size) {
		void *p = mmap(NULL, n->src_size, PROT_READ, MAP_SHARED, n->fd, 0);
		if (p == MAP_FAILED)
			return tp_fail(e, TP_EIO, "%s: cannot map: %s", n->path, strerror(errno));
		n->map = p;
	}
	m->ntensors += n->h.n;
	m->ntensor_files++;
	m->src_bytes += n->h.data_len;
	return 0;
}

static void unload_tensors(tp_node *n)
{
	if (n->map)
		munmap((void *)n->map, n->src_size);
	n->map = NULL;
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
	st_header_free(&n->h);
}

/* ---- tensors no rule matches ---- */

/* "[512, 64]" */
static void shape_text(const st_tensor *t, char *buf, size_t n)
{
	size_t w = 0;
	buf[0] = 0;
	for (uint32_t d = 0; d < t->ndim && w + 24 < n; d++)
		w += (size_t)snprintf(buf + w, n - w, "%s%llu", d ? ", " : "[", (unsigned long long)t->shape[d]);
	snprintf(buf + w, n - w, "%s", t->ndim ? "]" : "[] (a scalar)");
}

/* Writes into buf which per-rank count of the plan a tensor served whole would contradict: a dim
 * equal to a count the rank configs change, else one equal to that count times head_dim (unless
 * that is the hidden size, which a whole norm has too), or "" if none. */
static void contradicted_count(const tp_model *m, const st_tensor *t, char *buf, size_t n)
{
	tp_expr_ctx c = m->cfg;
	tp_err le;
	int64_t hd = 0, hidden = 0;
	buf[0] = 0;
	if (tp_expr_int(&c, "first(head_dim, hidden_size / num_attention_heads)", &hd, &le) != 0)
		hd = 0;
	if (tp_expr_int(&c, "hidden_size", &hidden, &le) != 0)
		hidden = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < m->plan.nper_rank; i++) {
			const tp_per_rank *pr = &m->plan.per_rank[i];
			int64_t v, local;
			if (pr->value || tp_expr_int(&c, pr->key, &v, &le) != 0 || v <= 1 || (pass && hd <= 1))
				continue;
			local = tp_model_rank_count(m, pr, 0);
			if (local < 0 || local == v)
				continue;
			uint64_t want = pass ? (uint64_t)(v * hd) : (uint64_t)v;
			if (pass && (int64_t)want == hidden)
				continue;
			for (uint32_t d = 0; d < t->ndim; d++) {
				if (t->shape[d] != want)
					continue;
				tp_fmt(buf, n,
				       "; served whole, its dim %u (%llu) equals '%s'%s (%lld), which rank 0's config.json states as "
				       "%lld at T=%u: the rank would load a tensor its config does not size",
				       d, (unsigned long long)t->shape[d], pr->key, pass ? " x head_dim" : "", (long long)v,
				       (long long)local, m->T);
				return;
			}
		}
}

/* The refusal of a tensor that no rule matches (the default; --unmatched replicate serves it whole). */
static int refuse_unmatched(const tp_model *m, const char *path, const st_tensor *t, tp_err *e)
{
	char sh[160], why[400];
	shape_text(t, sh, sizeof sh);
	contradicted_count(m, t, why, sizeof why);
	return tp_fail(e, TP_EPLAN,
		       "%s: tensor '%s' %s: no rule of plan '%s' matches it%s; a plan file that extends '%s' can say how "
		       "it is split (a \"replicate\" rule for a tensor known to be whole; docs/PLANS.md), or "
		       "--unmatched replicate serves every unmatched tensor whole%s",
		       path, t->name, sh, m->plan.name, why[0] ? why : "; no rule says it is whole", m->plan.name,
		       m->o->strict ? " (not with --strict)" : "");
}

/* The refusal of a checkpoint whose plan only its architectures picked and whose names the plan
 * does not know: the architecture is unknown. */
static int refuse_by_arch(const tp_model *m, const char *path, const st_tensor *t, tp_err *e)
{
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config, "model_type");
	char sh[160];
	shape_text(t, sh, sizeof sh);
	return tp_fail(e, TP_EINVAL,
		       "no built-in plan knows model_type '%.80s': config.json's architectures point at plan '%s', but the "
		       "checkpoint's names do not fit it (%s: tensor '%s' %s matches none of its rules); give a plan file "
		       "with --plan FILE (docs/PLANS.md), or force the plan with --plan %s after checking what "
		       "'tpfs plan SRC --tp N --plan %s' does",
		       cJSON_IsString(mt) ? mt->valuestring : "?", m->plan.name, path, t->name, sh, m->plan.name,
		       m->plan.name);
}

/* Did detection pick the plan through architectures alone (neither config.json's model_type
 * nor text_config's is one the plan's detect section lists)? */
static int picked_by_arch(const tp_model *m)
{
	const cJSON *det = cJSON_GetObjectItemCaseSensitive(m->plan.json, "detect");
	const cJSON *types = cJSON_GetObjectItemCaseSensitive(det, "model_type"), *it;
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config, "model_type");
	const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m->config, "text_config"),
							   "model_type");
	cJSON_ArrayForEach(it, types)
	{
		if (!cJSON_IsString(it))
			continue;
		if ((cJSON_IsString(mt) && !strcmp(mt->valuestring, it->valuestring)) ||
		    (cJSON_IsString(tmt) && !strcmp(tmt->valuestring, it->valuestring)))
			return 0;
	}
	return 1;
}

/* ---- resolving and laying out one file ---- */

/* The tensor index for companions over every planned safetensors file, in node order. */
static int build_tindex(const tp_model *m, tp_tindex *x, tp_err *e)
{
	tp_tindex_file *f = malloc((m->ntensor_files ? m->ntensor_files : 1) * sizeof *f);
	if (!f)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	size_t nf = 0;
	for (uint32_t i = 0; i < m->tree.nn; i++)
		if (m->tree.n[i].kind == TN_TENSORS && nf < m->ntensor_files)
			f[nf++] = (tp_tindex_file){m->tree.n[i].parent, &m->tree.n[i].h};
	int rc = tp_tindex_build(x, f, nf, m->o->strict, m->o->log, m->o->ctx, e);
	free(f);
	return rc;
}

static int plan_file(tp_model *m, uint32_t idx, tp_tindex *lc, tp_err *e)
{
	tp_node *n = &m->tree.n[idx];
	tp_resolve_opts ro = {.T = m->T, .pad_vocab = m->pad_vocab, .ep = m->o->ep, .ep_uneven = m->D > 1,
			      .D = m->D};
	tp_spec *specs = calloc(n->h.n ? n->h.n : 1, sizeof *specs);
	char (*why)[200] = calloc(n->h.n ? n->h.n : 1, sizeof *why);
	tp_text rt = {0}; /* the resolved plan's rules (rank_folder.h): tensor i's at rs[i] in rt */
	tp_span *rs = malloc((n->h.n ? n->h.n : 1) * sizeof *rs);
	for (size_t i = 0; rs && i < n->h.n; i++)
		rs[i].a = SIZE_MAX;
	const char **whyp = calloc(n->h.n ? n->h.n : 1, sizeof *whyp);
	int rc = 0;
	if (!specs || !why || !whyp)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	lc->dir = n->parent;
	for (size_t i = 0; i < n->h.n && rc == 0; i++) {
		tp_resolved res;
		if (tp_plan_resolve(&m->plan, &m->cfg, &n->h.t[i], tp_tindex_lookup, lc, &ro, n->path, &res, e) < 0) {
			if (!m->o->keep_going || e->code != TP_EPLAN) {
				rc = -1;
				break;
			}
			tp_model_log(m, 2, "%s", e->msg);
			m->nrefused++;
			memset(&res, 0, sizeof res);
			res.spec = tp_spec_replicate();
			res.rule = -2;
			tp_fmt(res.why, sizeof res.why, "REFUSED (see the errors)");
		}
		specs[i] = res.spec;
		if (res.rule >= 0)
			tp_fmt(why[i], sizeof why[i], "rule '%s': %s", m->plan.rules[res.rule].name, res.why);
		else
			tp_fmt(why[i], sizeof why[i], "%s", res.why);
		whyp[i] = why[i];
		if (res.rule == TP_RULE_EXPERTS)
			m->ep_tensors++;
		if (m->o->keep_going && res.spec.kind != TP_REPLICATE) {
			/* try every rank now, so that every unservable tensor is reported */
			tp_err ce;
			char ctx[TP_ERR_MSG];
			tp_fmt(ctx, sizeof ctx, "%s: tensor '%s' (%s)", n->path, n->h.t[i].name, why[i]);
			if (tp_plan_check_ranks(&n->h.t[i], &res.spec, m->T, ctx, &ce) < 0) {
				tp_model_log(m, 2, "%s", ce.msg);
				m->nrefused++;
				specs[i] = res.spec = tp_spec_replicate();
				tp_fmt(res.why, sizeof res.why, "REFUSED at T=%u (see the errors)", m->T);
			}
		}
		if (res.rule == -1) {
			m->nunmatched++;
			if (m->by_arch)
				rc = refuse_by_arch(m, n->path, &n->h.t[i], e);
			else if (m->o->strict || !m->o->unmatched_replicate) {
				refuse_unmatched(m, n->path, &n->h.t[i], e);
				if (m->o->keep_going && !m->o->strict) {
					tp_model_log(m, 2, "%s", e->msg);
					m->nrefused++;
					tp_fmt(res.why, sizeof res.why, "REFUSED: no rule matched (see the errors)");
				} else {
					rc = -1;
				}
			}
		}
		if (m->o->on_tensor)
			m->o->on_tensor(m->o->ctx, m, idx, (uint32_t)i, &res);
		if (rs) {
			rs[i].a = rt.len;
			tp_resolved_rule(&rt, &m->plan, &n->h.t[i], &res);
			rs[i].b = rt.len;
		}
	}
	if (rs) {
		tp_resolved_keep(&m->rf, m->tree.nn, idx, &n->h, &rt, rs);
	} else {
		free(rt.p);
		m->rf.resolved_failed = 1;
	}
	if (rc == 0) {
		n->lay = calloc(m->T, sizeof *n->lay);
		if (!n->lay)
			rc = tp_fail(e, TP_ENOMEM, "out of memory");
	}
	uint32_t *order = rc == 0 ? tp_layout_order(&n->h) : NULL; /* the same for every rank */
	if (rc == 0 && !order)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	/* Where every cut is affine in the rank (tp_layout_affine) and rank 1 holds rank 0's local
	 * tensors, ranks 0, 1 and T-1 are built and the ranks between take their pieces from 0 and 1:
	 * no time or memory per extra rank. Else (or when rank T-1 fails: the ranks in order then
	 * report the first failure) each rank is built on its own. */
	int aff = rc == 0 && tp_layout_affine(&n->h, specs, m->T);
	for (uint32_t r = 0; r < m->T && rc == 0; r++) {
		if (aff && r == 2 && n->lay[1].borrowed) {
			tp_err le;
			if (tp_layout_build_ordered(&n->h, specs, whyp, order, &n->lay[0], m->T, m->T - 1, n->path,
						    &n->lay[m->T - 1], &le) == 0) {
				for (uint32_t q = 2; q + 1 < m->T; q++)
					tp_layout_from_affine(&n->lay[0], &n->lay[1], q, &n->lay[q]); /* cannot fail here */
				break;
			}
		}
		rc = tp_layout_build_ordered(&n->h, specs, whyp, order, r ? &n->lay[0] : NULL, m->T, r, n->path,
					     &n->lay[r], e);
	}
	free(order);
	if (rc == 0 && m->o->view)
		n->specs = specs; /* the view cuts its pieces with them */
	else
		free(specs);
	free(why);
	free(whyp);
	return rc;
}

/* ---- the per-rank indexes ---- */

typedef struct index_ctx {
	const tp_model *m;
	uint32_t dir; /* the index's folder */
} index_ctx;

static tp_index_file index_find(void *vc, const char *rel)
{
	const index_ctx *c = vc;
	uint32_t f = tp_node_resolve(&c->m->tree, c->dir, rel);
	if (f == UINT32_MAX || c->m->tree.n[f].kind == TN_DIR)
		return (tp_index_file){.kind = TP_IX_NONE};
	if (c->m->tree.n[f].kind != TN_TENSORS)
		return (tp_index_file){.kind = TP_IX_OTHER};
	return (tp_index_file){.kind = TP_IX_TENSORS, .h = &c->m->tree.n[f].h, .lay = c->m->tree.n[f].lay};
}

/* Writes the T rewrites of index node idx (parsed as j) into its gen / gen_len. */
static int rewrite_index(tp_model *m, uint32_t idx, const cJSON *j, tp_err *e)
{
	tp_node *n = &m->tree.n[idx];
	index_ctx c = {m, n->parent};
	tp_index_in in = {.path = n->path, .T = m->T, .find = index_find, .find_ctx = &c, .log = m->o->log,
			  .log_ctx = m->o->ctx};
	return tp_index_rewrite(&in, j, &n->gen, &n->gen_len, e);
}

/* ---- the rank folders ---- */

/* The plan digest, the rank metadata and every rank's config.json (rank_folder.h), over every
 * planned safetensors file in node order. Sets config_node (the root's config.json when it is
 * served from the source, else UINT32_MAX), and its kind to TN_CONFIG once rewritten. */
static int build_rank_folders(tp_model *m, tp_err *e)
{
	tp_rf_file *f = malloc((m->ntensor_files ? m->ntensor_files : 1) * sizeof *f);
	if (!f)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	size_t nf = 0;
	for (uint32_t i = 0; i < m->tree.nn; i++)
		if (m->tree.n[i].kind == TN_TENSORS && nf < m->ntensor_files)
			f[nf++] = (tp_rf_file){&m->tree.n[i].h, m->tree.n[i].lay};
	m->config_node = tp_node_child(&m->tree, 0, "config.json");
	if (m->config_node == UINT32_MAX || !m->config || m->tree.n[m->config_node].kind != TN_PLAIN)
		m->config_node = UINT32_MAX;
	tp_node *cn = m->config_node != UINT32_MAX ? &m->tree.n[m->config_node] : NULL;
	const tp_model_opts *o = m->o;
	tp_rf_in in = {.plan = &m->plan, .cfg = &m->cfg, .T = m->T, .pad_vocab = m->pad_vocab, .ep = o->ep,
		       .config_global = o->config_global, .keep_going = o->keep_going, .ep_count = m->ep_count,
		       .log = o->log, .log_ctx = o->ctx, .files = f, .nfiles = nf, .config = m->config,
		       .config_plain = cn != NULL, .config_text = m->config_text, .config_len = m->config_len,
		       .config_size = cn ? cn->src_size : 0};
	char **gen = NULL;
	uint64_t *gen_len = NULL;
	int rewritten = 0;
	int rc = tp_rank_folder_build(&m->rf, &in, &gen, &gen_len, &rewritten, e);
	free(f);
	if (cn) {
		cn->gen = gen;
		cn->gen_len = gen_len;
		if (rc == 0 && rewritten)
			cn->kind = TN_CONFIG;
	}
	return rc;
}

int tp_model_open(tp_model *m, const tp_model_opts *o, tp_err *e)
{
	memset(m, 0, sizeof *m);
	m->o = o;
	m->T = o->T;
	m->P = o->pp > 1 ? o->pp : 1;
	m->D = o->dp > 1 ? o->dp : 1;
	if (o->T < 1 || o->T > TP_MAX_T)
		return tp_fail(e, TP_ELIMIT, "--tp %u: T must be between 1 and %d", o->T, TP_MAX_T);
	if ((uint64_t)m->D * o->T > TP_MAX_T)
		return tp_fail(e, TP_ELIMIT, "--dp %u: at most %d ranks in all (--dp x --tp)", o->dp, TP_MAX_T);
	if (m->D > 1 && (m->P > 1 || !o->ep || !o->view))
		return tp_fail(e, TP_EINVAL, "--dp %u: data-parallel ranks are served with --ep under an engine view "
			       "(--view vllm), without --pp", o->dp);
	if (o->pp > TP_PP_MAX || (uint64_t)o->pp * o->T > TP_MAX_T)
		return tp_fail(e, TP_ELIMIT, "--pp %u: from 1 to %d stages, and at most %d ranks in all (--pp x --tp)", o->pp,
			       TP_PP_MAX, TP_MAX_T);
	m->src = strdup(o->src);
	if (!m->src) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto fail;
	}
	if (tp_srctree_open(&m->tree, o->src, o->mnt, o->log, o->ctx, e) < 0)
		goto fail;

	/* indexes first: they say which tensor files are needed */
	cJSON **idx_json = calloc(m->tree.nn, sizeof *idx_json);
	if (!idx_json) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto fail;
	}
	int rc = 0;
	for (uint32_t i = 0; i < m->tree.nn && rc == 0; i++) {
		tp_node *n = &m->tree.n[i];
		if (n->kind == TN_TENSORS && n->parent == 0)
			n->needed = 1;
		if (n->kind != TN_INDEX)
			continue;
		tp_err ie;
		idx_json[i] = parse_json_file(n, NULL, NULL, &ie);
		if (!idx_json[i] || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(idx_json[i], "weight_map"))) {
			if (idx_json[i])
				tp_fmt(ie.msg, sizeof ie.msg, "%s: has no \"weight_map\" object", n->path);
			if (o->strict || n->parent == 0) {
				*e = ie;
				rc = -1;
			} else {
				tp_model_log(m, 0, "%s (served unchanged)", ie.msg);
				n->kind = TN_PLAIN;
			}
			cJSON_Delete(idx_json[i]);
			idx_json[i] = NULL;
			continue;
		}
		mark_needed(m, i, idx_json[i]);
	}
	for (uint32_t i = 0; i < m->tree.nn && rc == 0; i++) {
		tp_node *n = &m->tree.n[i];
		if (n->kind != TN_TENSORS)
			continue;
		tp_err le;
		if (load_tensors(m, n, &le) == 0)
			continue;
		unload_tensors(n);
		n->error = strdup(le.msg);
		if (o->check_only) {
			n->kind = TN_PLAIN;
		} else if (o->strict || n->needed) {
			*e = le;
			rc = -1;
		} else {
			tp_model_log(m, 0, "%s (not listed by an index and not at the top level: served unchanged)", le.msg);
			n->kind = TN_PLAIN;
		}
	}
	if (rc == 0 && !o->check_only) {
		uint32_t cfg = tp_node_child(&m->tree, 0, "config.json");
		if (cfg != UINT32_MAX && m->tree.n[cfg].kind == TN_PLAIN && m->tree.n[cfg].src_size > TP_MAX_CONFIG) {
			/* each rank's config.json is held in memory: the limit bounds what that costs */
			rc = tp_fail(e, TP_ELIMIT, "config.json: %llu bytes, more than the %d MiB tpfs reads of a config.json "
				     "(every rank's copy is held in memory; real ones are under a few MB)",
				     (unsigned long long)m->tree.n[cfg].src_size, TP_MAX_CONFIG >> 20);
		} else if (cfg != UINT32_MAX && m->tree.n[cfg].kind == TN_PLAIN) {
			m->config = parse_json_file(&m->tree.n[cfg], &m->config_text, &m->config_len, e);
			if (!m->config || !cJSON_IsObject(m->config)) {
				if (m->config)
					tp_fail(e, TP_EINVAL, "config.json: not a JSON object");
				rc = -1;
			}
		}
		if (rc == 0)
			rc = tp_plan_choose(m->config, o->plan, &m->plan, m->plan_origin, sizeof m->plan_origin, e);
		if (rc == 0 && !o->plan && m->config)
			m->by_arch = picked_by_arch(m);
		if (rc == 0) {
			m->cfg.config = m->config;
			m->cfg.nprefix = m->plan.nprefix;
			for (int i = 0; i < m->plan.nprefix; i++)
				m->cfg.prefix[i] = m->plan.prefix[i];
		}
		if (rc == 0) {
			tp_mview_choice vc = {.view = o->view, .pad_vocab = o->pad_vocab, .P = m->P, .D = m->D, .ep = o->ep,
					      .config = m->config, .log = o->log, .log_ctx = o->ctx};
			rc = tp_mview_choose(&vc, &m->plan, &m->view, &m->pad_vocab, e);
		}
		if (rc == 0 && o->ep)
			rc = tp_plan_ep_check(&m->plan, &m->cfg, m->D * m->T, m->D > 1, m->ep_count, e);
		/* the tensor index for companions */
		tp_tindex lc = {0};
		if (rc == 0)
			rc = build_tindex(m, &lc, e);
		for (uint32_t i = 0; i < m->tree.nn && rc == 0; i++)
			if (m->tree.n[i].kind == TN_TENSORS)
				rc = plan_file(m, i, &lc, e);
		tp_tindex_free(&lc);
		if (rc == 0 && o->ep && !m->ep_tensors)
			tp_model_log(m, 0, "--ep: no tensor of %s is a routed expert of plan '%s' (its experts declarations match none)",
			      m->src, m->plan.name);
		for (uint32_t i = 0; i < m->tree.nn && rc == 0 && !m->view; i++) /* an engine view serves no index (fs_names.c decode) */
			if (m->tree.n[i].kind == TN_INDEX && idx_json[i])
				rc = rewrite_index(m, i, idx_json[i], e);
		if (rc == 0)
			rc = build_rank_folders(m, e);
		if (rc == 0 && m->view) {
			uint32_t ri = tp_node_child(&m->tree, 0, "model.safetensors.index.json");
			tp_mview_in vi = {.view = m->view, .tree = &m->tree, .ntensor_files = (uint32_t)m->ntensor_files,
					  .root_index = ri != UINT32_MAX ? idx_json[ri] : NULL, .cfg = &m->cfg, .T = m->T,
					  .P = m->P, .D = m->D, .ep = o->ep, .pp_layers = o->pp_layers, .rank_meta = m->rf.rank_meta,
					  .log = o->log, .log_ctx = o->ctx};
			rc = tp_mview_build(&vi, &m->mv, e);
		}
	}
	for (uint32_t i = 0; i < m->tree.nn; i++)
		cJSON_Delete(idx_json[i]);
	free(idx_json);
	if (rc == 0)
		return 0;
fail:
	tp_model_close(m);
	return -1;
}

void tp_model_close(tp_model *m)
{
	tp_mview_free(&m->mv); /* it points into the headers and the rank metadata */
	if (m->view)
		tp_view_free(m->view);
	free(m->view);
	for (uint32_t i = 0; i < m->tree.nn; i++) {
		tp_node *n = &m->tree.n[i];
		if (n->lay) /* rank 0 last: the others may borrow from it */
			for (uint32_t r = m->T; r-- > 0;)
				tp_layout_free(&n->lay[r]);
		free(n->lay);
		free(n->specs);
		if (n->gen)
			for (uint32_t r = 0; r < m->T; r++)
				free(n->gen[r]);
		free(n->gen);
		free(n->gen_len);
		unload_tensors(n);
		free(n->error);
	}
	tp_srctree_free(&m->tree);
	tp_rank_folder_free(&m->rf);
	free(m->config_text);
	cJSON_Delete(m->config);
	tp_plan_free(&m->plan);
	free(m->src);
	memset(m, 0, sizeof *m);
}

uint64_t tp_node_size(const tp_model *m, uint32_t i, uint32_t r)
{
	const tp_node *n = &m->tree.n[i];
	switch (n->kind) {
	case TN_TENSORS:
		return n->lay ? n->lay[r].size : n->src_size;
	case TN_INDEX:
	case TN_CONFIG:
		return n->gen ? n->gen_len[r] : n->src_size;
	case TN_PLAIN:
		return n->src_size;
	default:
		return 4096;
	}
}

void tp_model_ep_range(const tp_model *m, int d, uint32_t r, uint64_t *first, uint64_t *count)
{
	*first = *count = 0;
	if (!m->o || !m->o->ep || d < 0 || d >= m->plan.nexperts)
		return;
	if (m->D > 1) { /* EP rank r of D x T: vLLM's linear placement, the first E mod N one more */
		tp_spec s = tp_spec_owned((uint64_t)m->ep_count[d], 0);
		tp_share sh;
		s.flags = TP_UNEVEN;
		if (m->ep_count[d] > 0 && tp_share_of(s.seg[0], &s, m->D * m->T, r, &sh, "", NULL) == 0) {
			*first = sh.first;
			*count = sh.count;
		}
		return;
	}
	tp_ep_range(m->ep_count[d], m->T, r, first, count);
}

int64_t tp_model_rank_count(const tp_model *m, const tp_per_rank *pr, uint32_t r)
{
	tp_expr_ctx c = m->cfg;
	int64_t v;
	tp_err e;
	if (tp_expr_int(&c, pr->value ? pr->value : pr->key, &v, &e) != 0 || v < 0)
		return -1;
	if (pr->value)
		return v;
	tp_spec s = tp_spec_split(0, (uint64_t)v, 1);
	s.flags = (pr->uneven ? TP_UNEVEN : 0) | (pr->groups ? TP_GROUPS : 0);
	s.pad_to = pr->vocab && m->pad_vocab > 1 ? m->pad_vocab : 0;
	tp_share sh;
	if (tp_share_of((uint64_t)v, &s, m->T, r, &sh, pr->key, &e) < 0)
		return -1;
	return (int64_t)(sh.count + sh.zeros);
}

/* ---- the served files, as the front ends reach them (model.h) ---- */

void tp_model_view_name(const tp_model *m, uint32_t g, size_t k, char *out, size_t cap)
{
	tp_mview_name(m->T, m->P, m->D, g, k, out, cap);
}

int tp_model_view_slot(const tp_model *m, uint32_t g, size_t k)
{
	return tp_mview_slot(&m->mv, g, k);
}

void tp_model_stage_layers(const tp_model *m, uint32_t s, uint64_t *first, uint64_t *end)
{
	*first = m->mv.pp_start[s];
	*end = m->mv.pp_start[s + 1];
}

uint32_t tp_model_ranks(const tp_model *m)
{
	return m->view ? m->mv.W : m->T;
}

size_t tp_model_view_parts(const tp_model *m)
{
	return m->view ? m->mv.vplan.nparts : 0;
}

const uint32_t *tp_model_view_part_nodes(const tp_model *m, size_t p, uint32_t *nsrc)
{
	*nsrc = m->mv.vplan.parts[p].nsrc;
	return m->mv.node[p];
}

int tp_model_view_file(const tp_model *m, uint32_t g, size_t k, tp_view_file *f)
{
	return tp_mview_file(&m->mv, g, k, f);
}
