/* fuzz_header.c: libFuzzer target. The input is a whole safetensors file. If its header parses,
 * every tensor is cut by a spec derived from the input for T in {1, 2, 3, 5}, every rank's layout
 * is built, its header is written and must parse back, and ranges are mapped and gathered from
 * the input: nothing may crash, read out of bounds, or disagree with itself. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gather.h"
#include "layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 8)
		return 0;
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | data[i];
	if (n > size - 8)
		return 0;
	st_header h;
	tp_err e;
	if (st_parse_header((const char *)data + 8, n, size, "fuzz", &h, &e) < 0)
		return 0;
	tp_spec *specs = calloc(h.n ? h.n : 1, sizeof *specs);
	uint8_t knob = data[size - 1];
	for (size_t i = 0; i < h.n; i++) {
		const st_tensor *t = &h.t[i];
		if (!t->ndim || ((knob + i) & 3) == 0) {
			specs[i] = tp_spec_replicate();
			continue;
		}
		uint32_t axis = (uint32_t)((knob + i) % t->ndim);
		specs[i] = tp_spec_split(axis, t->shape[axis], 1);
		specs[i].flags = (knob & 1 ? TP_UNEVEN : 0) | (knob & 2 ? TP_GROUPS : 0);
		if (knob & 4 && t->shape[axis] % 2 == 0 && t->shape[axis]) {
			specs[i].nseg = 2;
			specs[i].seg[0] = specs[i].seg[1] = t->shape[axis] / 2;
		}
		if (knob & 8)
			specs[i].pad_to = 4;
	}
	const uint32_t Ts[] = {1, 2, 3, 5};
	tp_src src = {.fd = -1, .map = data, .size = size};
	for (int ti = 0; ti < 4; ti++) {
		for (uint32_t r = 0; r < Ts[ti]; r++) {
			tp_layout L;
			if (tp_layout_build(&h, specs, NULL, Ts[ti], r, "fuzz", &L, &e) < 0)
				break;
			char *hdr = malloc(L.hdr_size);
			tp_layout_header(&L, hdr);
			st_header back;
			uint64_t bn = L.hdr_size - 8;
			if (st_parse_header(hdr + 8, bn, L.size, "rank", &back, &e) < 0)
				abort(); /* the writer produced a header the parser refuses */
			if (back.n != L.n || back.data_len != L.data_size)
				abort();
			st_header_free(&back);
			uint8_t buf[4096];
			tp_run runs[64];
			for (uint64_t off = 0; off < L.size; off += 997 + (L.size / 7)) {
				uint64_t cov, len = sizeof buf;
				size_t nr = tp_map(&L, off, len, runs, 64, &cov);
				if (tp_runs_bytes(runs, nr) != cov)
					abort();
				if (tp_gather_cpu(runs, nr, &src, (const uint8_t *)hdr, buf, &e) < 0)
					abort(); /* runs must lie inside the source */
			}
			free(hdr);
			tp_layout_free(&L);
		}
	}
	free(specs);
	st_header_free(&h);
	return 0;
}
