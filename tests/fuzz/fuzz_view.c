/* fuzz_view.c: libFuzzer target for engine view files (view.c, view_resolve.c). The input is a
 * view file. Where it parses, it is resolved over a fixed checkpoint of two files with real names
 * and shapes (a dense layer with q/k/v and its biases, MLA projections, experts with a router and
 * a shared expert, an MTP layer, tied embeddings), each tensor split on its first axis, once with
 * every entry on and once with the conditional ("if") entries off.
 * Nothing may crash or leak; every served tensor's pieces must name a source tensor of a source
 * the part reads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "view.h"

static const char *FILES[2] = {
	"{\"model.embed_tokens.weight\":[64,16],\"lm_head.weight\":[64,16],\"model.norm.weight\":[16],"
	"\"model.layers.0.self_attn.q_proj.weight\":[32,16],\"model.layers.0.self_attn.k_proj.weight\":[8,16],"
	"\"model.layers.0.self_attn.v_proj.weight\":[8,16],\"model.layers.0.self_attn.q_proj.bias\":[32],"
	"\"model.layers.0.self_attn.k_proj.bias\":[8],\"model.layers.0.self_attn.v_proj.bias\":[8],"
	"\"model.layers.0.self_attn.o_proj.weight\":[16,32],\"model.layers.0.mlp.gate_proj.weight\":[32,16],"
	"\"model.layers.0.mlp.up_proj.weight\":[32,16],\"model.layers.0.mlp.down_proj.weight\":[16,32],"
	"\"model.layers.0.input_layernorm.weight\":[16]}",
	"{\"model.layers.1.self_attn.q_a_proj.weight\":[8,16],\"model.layers.1.self_attn.kv_a_proj_with_mqa.weight\":[12,16],"
	"\"model.layers.1.self_attn.q_b_proj.weight\":[32,8],\"model.layers.1.self_attn.kv_b_proj.weight\":[32,8],"
	"\"model.layers.1.mlp.gate.weight\":[4,16],\"model.layers.1.mlp.gate.e_score_correction_bias\":[4],"
	"\"model.layers.1.mlp.experts.0.gate_proj.weight\":[8,16],\"model.layers.1.mlp.experts.0.up_proj.weight\":[8,16],"
	"\"model.layers.1.mlp.experts.0.down_proj.weight\":[16,8],\"model.layers.1.mlp.experts.1.gate_proj.weight\":[8,16],"
	"\"model.layers.1.mlp.experts.1.up_proj.weight\":[8,16],\"model.layers.1.mlp.experts.1.down_proj.weight\":[16,8],"
	"\"model.layers.1.mlp.shared_experts.gate_proj.weight\":[8,16],\"model.layers.2.eh_proj.weight\":[16,32],"
	"\"model.layers.2.shared_head.head.weight\":[64,16]}",
};

/* A header of BF16 tensors from {"name": [dims], ...}. */
static int header(const char *spec, st_header *h)
{
	char json[8192];
	size_t w = 0;
	uint64_t off = 0;
	const char *p = spec + 1;
	w += (size_t)snprintf(json + w, sizeof json - w, "{");
	while (*p == '"') {
		const char *q = strchr(p + 1, '"');
		const char *dims = q + 2, *end = strchr(dims, ']');
		uint64_t n = 2;
		for (const char *d = dims + 1; d < end;) {
			char *next;
			n *= strtoull(d, &next, 10);
			d = *next == ',' ? next + 1 : next;
		}
		w += (size_t)snprintf(json + w, sizeof json - w, "%s%.*s:{\"dtype\":\"BF16\",\"shape\":%.*s,\"data_offsets\":[%llu,%llu]}",
				      w > 1 ? "," : "", (int)(q - p + 1), p, (int)(end - dims + 1), dims,
				      (unsigned long long)off, (unsigned long long)(off + n));
		off += n;
		p = end + 1;
		if (*p == ',')
			p++;
	}
	w += (size_t)snprintf(json + w, sizeof json - w, "}");
	while (w % 8)
		json[w++] = ' ';
	tp_err e;
	return st_parse_header(json, w, 8 + w + off, "src", h, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static st_header h[2];
	static tp_spec *specs[2];
	static tp_vsource src[2];
	static int ready;
	if (!ready) {
		for (int k = 0; k < 2; k++) {
			if (header(FILES[k], &h[k]) < 0)
				abort();
			specs[k] = calloc(h[k].n, sizeof *specs[k]);
			for (size_t i = 0; i < h[k].n; i++)
				specs[k][i] = tp_spec_split(0, h[k].t[i].shape[0], 1);
			src[k] = (tp_vsource){k ? "b.safetensors" : "a.safetensors", &h[k], specs[k]};
		}
		ready = 1;
	}
	tp_view v;
	tp_err e;
	if (tp_view_parse((const char *)data, size, "fuzz", &v, &e) < 0)
		return 0;
	uint8_t *off = calloc(v.ne ? v.ne : 1, 1);
	for (int pass = 0; off && pass < 2; pass++) {
		for (size_t k = 0; k < v.ne; k++)
			off[k] = pass && v.e[k].cond && !v.e[k].per_match; /* the second pass: every conditional entry off */
		tp_vcfg vc = {.off = off};
		tp_vplan p;
		if (tp_view_resolve(&v, &vc, src, 2, &p, &e) < 0)
			continue;
		for (size_t q = 0; q < p.nparts; q++)
			for (size_t j = 0; j < p.parts[q].n; j++)
				for (uint32_t x = 0; x < p.parts[q].d[j].npieces * (p.parts[q].d[j].nstack ? p.parts[q].d[j].nstack : 1); x++) {
					const tp_pdesc *pd = &p.parts[q].d[j].pieces[x];
					if (pd->file >= p.parts[q].nsrc || pd->tensor >= h[p.parts[q].srcs[pd->file]].n)
						abort();
				}
		tp_vplan_free(&p);
	}
	free(off);
	tp_view_free(&v);
	return 0;
}
