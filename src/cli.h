/* cli.h: what the files of the tpfs command line share: the help texts, the argument helpers and
 * the options mount and plan have in common (cli_help.c), and the plan command (cli_plan.c).
 * main and the other commands are in cli.c. Nothing below the CLI includes it.
 */
#ifndef TP_CLI_H
#define TP_CLI_H

#include <stdint.h>

#include "model.h"

/* The help texts (cli_help.c): the overview, then one per command. */
extern const char *const usage_main, *const usage_mount, *const usage_plan, *const usage_check,
	*const usage_umount, *const usage_stats;

/* Prints "tpfs: msg" (when msg is not NULL), a blank line and the usage text u on stderr;
 * returns 2, the exit status of a usage error. */
int die_usage(const char *u, const char *msg);

/* Parses a decimal number without sign or blanks into *out. Returns 0, or -1 when s is not one
 * or does not fit 32 bits. */
int parse_u32(const char *s, uint32_t *out);

/* Parses an option that mount and plan share (--tp, --plan, --strict, --unmatched, --pad-vocab, --ep,
 * --view, --pp, --pp-layers) into mo.
 * Returns 1 when c was one of them, 0 when it was not, or 2 (the exit status) after a usage
 * error. *have_t records --tp. */
int model_option(int c, const char *arg, tp_model_opts *mo, int *have_t, const char *usage);

/* Checks what the shared options say together once all are parsed (--pp-layers against --pp,
 * --pp without a view). Returns 0, or 2 after a usage error. */
int model_options_check(const tp_model_opts *mo, const char *usage);

/* tpfs plan (cli_plan.c): argv after the command name; returns the exit status. */
int cmd_plan(int argc, char **argv);

#endif
