"""The integrity commands of ``ckptfs``: ``manifest``, ``verify`` and ``diff`` (registered in ckptfs.commands.cli).

Exit codes (docs/interfaces.md, "Integrity"): 0 when everything matches (``diff``: nothing differs), 3 when
something does not, 1 on a checkpoint or runtime error (one line on stderr), 2 on usage errors. Mismatches go
to stdout, one per line; a progress bar is drawn on stderr only when stderr is a terminal, so pipes and logs
stay clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

import click

from ckptfs.commands.failure import fail, verbose_option
from ckptfs.commands.source import with_source
from ckptfs.util.redact import public_name

MISMATCH_EXIT = 3


@contextlib.contextmanager
def _progress(total: int, label: str):
    """A callable taking byte counts: a click progress bar on a terminal's stderr, else nothing."""
    if total <= 0 or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=total, label=label, file=sys.stderr, show_eta=True) as bar:
        yield bar.update


class _AtomicOutput:
    """``path`` written through a temporary file renamed over it: never a half-written manifest. The
    temporary file is made when this is created, before any hashing, so an output that cannot be written
    fails at once; its OSErrors name ``path`` as the user gave it, not the temporary name."""

    def __init__(self, path: str):
        self.path = path
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=".ckptfs-manifest-", dir=os.path.dirname(os.path.abspath(path)))
        except OSError as exc:
            raise self._error(exc) from None
        self.file = os.fdopen(fd, "w", encoding="utf-8")

    def _error(self, exc: OSError) -> OSError:
        error = OSError(f"cannot write {self.path}: {exc.strerror}")  # str(): the message alone, no [Errno N]
        error.errno = exc.errno
        return error

    def commit(self, text: str) -> None:
        try:
            with self.file:
                self.file.write(text)
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.discard()
            raise self._error(exc) from None

    def discard(self) -> None:
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def plural(n: int, word: str) -> str:
    """``1 mismatch``, ``2 mismatches``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


@click.command("manifest")
@with_source()
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the manifest here (default: stdout).")
@verbose_option
def manifest_command(src, output, verbose):
    """Write the ckptfs-manifest/1 of SRC: each file's size and sha256 (the Hub's LFS oid), each tensor's
    place, crc32, sha256 and 1 MiB chunk crc32s. Every byte is read once; files are hashed in parallel."""
    from ckptfs.checkpoint.api import open as open_checkpoint
    from ckptfs.integrity.manifest import build_manifest, total_bytes

    try:
        out = _AtomicOutput(output) if output is not None else None
        try:
            with open_checkpoint(src) as ck, _progress(total_bytes(ck), "hashing") as progress:
                text = build_manifest(ck, progress=progress).dumps()
        except BaseException:
            if out is not None:
                out.discard()
            raise
        if out is None:
            click.echo(text, nl=False)
        else:
            out.commit(text)
    except Exception as exc:  # noqa: BLE001 - the CLI turns every failure into one line
        fail(exc, verbose)


@click.command("verify")
@with_source()
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False), default=None,
              help="Compare with this manifest (default: check structure, and Hub files against their LFS oid).")
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": bool, "mismatches": [{"file", "tensor", "what"}]}.')
@verbose_option
def verify_command(src, manifest_path, as_json, verbose):
    """Check SRC against a manifest (or its structure): exit 0 if it matches, 3 if not, one line per mismatch."""
    from ckptfs.checkpoint.api import open as open_checkpoint
    from ckptfs.integrity.manifest import load_manifest
    from ckptfs.integrity.verify import bytes_to_check, verify

    try:
        manifest = load_manifest(manifest_path) if manifest_path is not None else None
        with open_checkpoint(src) as ck, _progress(bytes_to_check(ck, manifest), "verifying") as progress:
            mismatches = verify(ck, manifest, progress=progress)
    except Exception as exc:  # noqa: BLE001 - the CLI turns every failure into one line
        fail(exc, verbose)
    if as_json:
        click.echo(json.dumps({"ok": not mismatches, "mismatches": [m.to_json() for m in mismatches]}, indent=2))
    else:
        for m in mismatches:
            click.echo(m.line())
        what = "the manifest" if manifest_path is not None else "its structure"
        click.echo(f"{plural(len(mismatches), 'mismatch')} against {what}" if mismatches else f"ok: {public_name(src)} matches {what}",
                   err=True)
    sys.exit(MISMATCH_EXIT if mismatches else 0)


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--values", is_flag=True, help="Also compare dequantized values (max absolute and relative difference).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@verbose_option
def diff_command(a, b, values, as_json, verbose):
    """What differs between checkpoints A and B (either may be a manifest): tensors only in one, other
    shape or type, other stored bytes; exit 0 if nothing differs, 3 if something does."""
    from ckptfs.integrity.diff import diff, open_side
    from ckptfs.integrity.manifest import is_manifest

    if values and (is_manifest(a) or is_manifest(b)):
        raise click.UsageError("--values needs two checkpoints: a manifest holds no values")
    sides = []
    try:
        sides.append(open_side(a))
        sides.append(open_side(b))
        result = diff(sides[0], sides[1], values=values)
    except Exception as exc:  # noqa: BLE001 - the CLI turns every failure into one line
        fail(exc, verbose)
    finally:
        for side in sides:
            if side.checkpoint is not None:
                side.checkpoint.close()
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        for line in result.lines():
            click.echo(line)
    sys.exit(MISMATCH_EXIT if result.differs else 0)
