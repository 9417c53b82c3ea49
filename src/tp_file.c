/* tp_file.c: the two producers of tensor files behind one interface (see tp_file.h). */
#include "tp_file.h"

uint64_t tp_file_size(tp_file f)
{
	return f.L ? f.L->size : f.S->size;
}

uint64_t tp_file_hdr_size(tp_file f)
{
	return f.L ? f.L->hdr_size : f.S->hdr_size;
}

uint64_t tp_file_local_size(tp_file f)
{
	return f.L ? f.L->hdr_size : f.S->local_size;
}

void tp_file_local(tp_file f, uint8_t *buf)
{
	if (f.L)
		tp_layout_header(f.L, (char *)buf);
	else
		tp_served_local(f.S, buf);
}

uint32_t tp_file_nsrc(tp_file f)
{
	return f.L ? 1 : f.S->nsrc;
}

size_t tp_file_map(tp_file f, uint64_t off, uint64_t len, tp_run *out, size_t cap, uint64_t *covered)
{
	return f.L ? tp_map(f.L, off, len, out, cap, covered) : tp_served_map(f.S, off, len, out, cap, covered);
}

size_t tp_file_io_plan(tp_file f, uint64_t a, uint64_t b, uint64_t page, tp_io_range *out, size_t cap,
		       uint64_t *covered, uint64_t *cut)
{
	if (f.L) {
		*cut = 0;
		return tp_io_plan(f.L, a, b, page, out, cap, covered);
	}
	return tp_served_io_plan(f.S, a, b, page, out, cap, covered, cut);
}
