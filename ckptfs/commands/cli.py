"""The ``ckptfs`` command: mount, umount, info, bench.

Errors are one line on stderr, never a traceback (``-v`` adds it): exit 1 for a checkpoint or runtime error,
2 for usage errors (click's own convention). click prints a usage error as a block of usage, hint and error;
``OneLineGroup`` prints it as one line ending with the hint to ``--help``. Names in messages are escaped
(``oneline``), so a path or tensor name holding a newline cannot split the line.
"""

from __future__ import annotations

import errno
import json
import os
import sys

import click

from ckptfs.core.errors import CheckpointError
from ckptfs.util.oneline import one_line
from ckptfs.commands.open_flags import open_flags
from ckptfs.commands.failure import fail, verbose_option
from ckptfs.commands.cache import cache_group
from ckptfs.commands.ending import end_process
from ckptfs.commands.prefetch import prefetch
from ckptfs.commands.source import with_source
from ckptfs.util.redact import hide_in_argv, redact


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # probe: third-party (click >= 8.2)


class OneLineGroup(click.Group):
    """click, with its usage errors (missing argument, bad choice, unknown option or command) printed as one
    line, exit code 2 kept. Help (``--help``, or no command at all) is printed in full as usual."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        # Every command first takes the secrets of the URLs it was given (user:password@, a presigned query)
        # out of its command line, which ps shows every user (best effort; ckptfs.commands.source).
        hide_in_argv()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as exc:  # `ckptfs` alone: the full help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(one_line(redact(f"ckptfs: usage error: {exc.format_message()}")) + hint, err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(one_line(redact(f"ckptfs: error: {exc.format_message()}")), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("ckptfs: aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ckptfs")
def main() -> None:
    """Mount LLM checkpoints (GGUF, safetensors) as read-only filesystems of lazy .npy views."""


@main.command()
@with_source("mountpoint")
@click.option("-f", "--foreground", is_flag=True, help="Stay in the foreground (log to stderr with -v).")
@click.option("-o", "options", multiple=True, metavar="OPTS", help="FUSE mount options, comma-separated.")
@open_flags()  # every open option (the fstab helper's -o names come from this list)
@click.option("--log-file", type=click.Path(), default=None, help="Log file (for the daemon).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Log lines as text or as one JSON object per line (for log shippers).")
@click.option("--layout", type=click.Choice(["flat", "tree"]), default="flat", show_default=True,
              help="tree: dotted tensor names as folders (blk/0/attn_q.weight.npy).")
@click.option("--metrics", default=None, metavar="[HOST:]PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (HOST: 127.0.0.1; needs ckptfs[metrics]).")
@click.option("--hf", is_flag=True, help="Add hf/: a GGUF as a Hugging Face model folder (needs ckptfs[hf]), or a quantized "
                   "folder's unquantized release.")
@click.option("--hf-dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True, help="dtype of hf/'s safetensors files.")
@click.option("--gguf", is_flag=True,
              help="Add gguf/model.gguf: a Hugging Face folder as llama.cpp's converter writes it "
                   "(needs ckptfs[gguf]).")
@click.option("--gguf-type", type=click.Choice(["auto", "f32", "f16", "bf16", "q8_0"]), default="auto",
              show_default=True, help="Output type of gguf/model.gguf (auto: bf16 for a BF16 folder, else f16).")
@click.option("--gguf-fp8-as-q8", is_flag=True,
              help="gguf/model.gguf: a quantized folder's FP8 layers in Q8_0 whatever --gguf-type (the converter's "
                   "--fp8-as-q8).")
@click.option("--prefetch", is_flag=True,
              help="Once mounted, fetch every stored byte of a remote SRC into --cache-dir in the background.")
@click.option("-v", "--verbose", is_flag=True, help="Verbose logging; tracebacks on errors.")
def mount(src, mountpoint, foreground, options, open_options, log_file, hf, hf_dtype, log_format, layout, metrics,
          verbose, prefetch, gguf, gguf_type, gguf_fp8_as_q8):
    """Mount checkpoint SRC read-only at MOUNTPOINT."""
    from ckptfs.service.mount import MountError, MountRequest, run_mount
    from ckptfs.sources import is_url

    if prefetch and is_url(src) and not open_options.cache_dir:
        raise click.UsageError("--prefetch fetches into --cache-dir DIR: give one (without it the bytes would "
                               "be kept in memory only)")
    try:
        request = MountRequest(src=src, mountpoint=mountpoint, foreground=foreground, options=",".join(options),
                               open_options=open_options, log_file=log_file, hf=hf, hf_dtype=hf_dtype,
                               gguf=gguf, gguf_type=gguf_type, gguf_fp8_as_q8=gguf_fp8_as_q8, verbose=verbose, log_format=log_format,
                               metrics=metrics, layout=layout, prefetch=prefetch)
        code = run_mount(request)
    except (CheckpointError, MountError, OSError, ValueError) as exc:
        fail(exc, verbose)
    sys.exit(code)


@main.command()
@click.argument("mountpoint")
@verbose_option
def umount(mountpoint, verbose):
    """Unmount a ckptfs mount (fusermount3, then fusermount, then lazy)."""
    from ckptfs.service.mount import MountError, unmount

    try:
        unmount(mountpoint)
    except (MountError, OSError) as exc:
        fail(exc, verbose)


@main.command()
@with_source()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@open_flags(omit={"dtype": "it shows stored types", "cache_size": "it decodes no tensor",
                  "max_open_files": "it reads each file's header once",
                  "redis": "it decodes no tensor (the tier holds decoded groups)", "redis_cluster": "likewise",
                  "manifest": "it reads no tensor bytes to check (ckptfs verify does)"})
@verbose_option
@click.option("--hf", "hf", is_flag=True,
              help="Also say whether a mount with --hf gets hf/, or why not (a GGUF's: imports transformers).")
@click.option("--gguf", "gguf", is_flag=True,
              help="Also say whether a mount with --gguf gets gguf/model.gguf, or why not (builds its header).")
@click.option("--all", "every", is_flag=True, help="List every file and checkpoint (the text form shows the first 20).")
def info(src, as_json, hf, verbose, open_options, every, gguf):
    """Summarize a checkpoint: format, tensors, storage types, metadata, damage."""
    from ckptfs import open as open_checkpoint
    from ckptfs.commands.info import render, repository_summary, summary
    from ckptfs.formats.repository import SeveralCheckpoints

    try:
        with open_checkpoint(src, options=open_options) as ck:
            data = summary(ck, hf=hf, gguf=gguf)
    except SeveralCheckpoints as several:  # a repository: the checkpoints it holds (none is opened)
        data = repository_summary(several.repository)
    except Exception as exc:  # noqa: BLE001 - the CLI turns every failure into one line
        fail(exc, verbose)
    click.echo(json.dumps(data, indent=2) if as_json else render(data, every))


@main.command()
@with_source()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--local", "local", default=None, metavar="PATH",
              help="For a URL: a local copy of the same checkpoint, benchmarked beside it.")
@open_flags(omit={"dtype": "the reference libraries' values are compared at the default",
                  "max_open_files": "a mount is measured with the default",
                  "redis": "a shared tier would serve groups decoded before the run", "redis_cluster": "likewise",
                  "manifest": "its workloads measure unchecked reads"})
@click.option("-v", "--verbose", is_flag=True, help="Log each phase instead of a progress line; tracebacks on errors.")
def bench(src, as_json, local, open_options, verbose):
    """Benchmark reads of SRC through a temporary mount, beside gguf-py/safetensors when installed (for a
    URL: requests, bytes fetched, header bytes, first-read latency and stream throughput, beside --local)."""
    from ckptfs.sources import is_url

    try:
        if is_url(src):
            from ckptfs.bench.remote import run_remote_bench

            sys.exit(run_remote_bench(src, local=local, as_json=as_json, options=open_options))
        from ckptfs.bench import run_bench

        sys.exit(run_bench(src, as_json=as_json, options=open_options, verbose=verbose))
    except (CheckpointError, OSError) as exc:
        fail(exc, verbose)


main.add_command(cache_group)
main.add_command(prefetch)


@main.command()
@click.argument("mountpoint")
@click.option("--json", "as_json", is_flag=True, help="The stats JSON as the mount serves it.")
@verbose_option
def stats(mountpoint, as_json, verbose):
    """Show a mount's counters: cache tiers, decoded bytes, source requests (the root xattr)."""
    from ckptfs.fuse.operations import STATS_XATTR
    from ckptfs.fuse.stats import render_table

    try:
        data = json.loads(os.getxattr(mountpoint, STATS_XATTR))
    except OSError as exc:
        if exc.errno in (errno.ENODATA, getattr(errno, "ENOATTR", errno.ENODATA), errno.ENOTSUP):  # probe: platform
            exc = ValueError(f"{mountpoint} is not a ckptfs mount root (no {STATS_XATTR})")
        fail(exc, verbose)
    except ValueError as exc:
        fail(ValueError(f"{mountpoint}: {STATS_XATTR} is not JSON: {exc}"), verbose)
    click.echo(json.dumps(data, indent=2) if as_json else render_table(data))


@main.command("install-mount-helper")
@click.option("--target", default=None, metavar="PATH",
              help="Where to write it (default /sbin/mount.fuse.ckptfs, where mount(8) looks).")
@verbose_option
def install_mount_helper(target, verbose):
    """Write the helper mount(8) runs for `mount -t fuse.ckptfs` and fstab lines (runs this ckptfs)."""
    from ckptfs.commands.mount_helper import HELPER_PATH, install_helper

    try:
        click.echo(install_helper(target or HELPER_PATH))
    except OSError as exc:
        fail(exc, verbose)

from ckptfs.commands.integrity import diff_command, manifest_command, verify_command  # noqa: E402 - registered last

main.add_command(manifest_command)
main.add_command(verify_command)
main.add_command(diff_command)


BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"


def hold_blas_to_one_thread() -> None:
    """numpy's OpenBLAS starts a pool of threads when numpy is imported, which spin for a while before they
    sleep: 0.06 CPU-seconds of every ckptfs process on a 2-core machine (numpy's import 0.14 CPU-s, 0.08 with
    one thread), taken from what the process starts beside it (a prefetch's first transfers). ckptfs calls no
    BLAS (its decoders are element-wise), so its programs hold OpenBLAS to one thread unless told otherwise;
    called before anything imports numpy."""
    os.environ.setdefault(BLAS_THREADS_VARIABLE, "1")


def program() -> None:
    """The ``ckptfs`` program (its console script, ``python -m ckptfs.commands.cli``): ``main``, and the end of
    the process at once after a command that asked for it (``ckptfs.commands.ending``)."""
    hold_blas_to_one_thread()
    try:
        main()
    except SystemExit as exc:
        end_process(exc)


if __name__ == "__main__":
    program()
