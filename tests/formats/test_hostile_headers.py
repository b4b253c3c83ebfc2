"""A regression corpus of hand-made hostile headers: each is refused, quickly and in one line.

docs/interfaces.md, "Damage: refuse or serve", lists what is refused at open: bad magic, a GGUF version other
than 2/3, counts, lengths or strings larger than the file, a header cut short, an alignment of zero or not a power of
two, shapes whose size overflows 64 bits, and the safetensors header rules. Every file here is built in code,
byte by byte. For each one:

- ``ckptfs.open`` raises ``CheckpointError`` whose message names the file and the reason, raised by an
  explicit check (not by the readers' last-resort conversion of an unexpected exception), and it does so
  under a 10-second hang guard (the measured times, a few milliseconds, are in docs/performance.md);
- ``ckptfs info`` and ``ckptfs mount`` print exactly one line on stderr and exit 1 (in-process for the whole
  corpus; in real subprocesses for a sample, which also checks that nothing gets mounted).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_runs import one_error_line
from conftest import ckptfs_cli, cli_env, fuse_problem, is_mounted, require_fuse

import ckptfs
from ckptfs.commands.cli import main as cli_main
from ckptfs.core.errors import CheckpointError
from ckptfs.formats import read_gguf, read_safetensors

HANG_GUARD_SECONDS = 10.0

# GGUF value types and ggml type ids used below (ggml docs/gguf.md, ggml.h)
UINT8, UINT32, INT32, STRING, ARRAY, UINT64 = 0, 4, 5, 8, 9, 10
F32, Q8_0, Q4_K = 0, 8, 12


# ------------------------------------------------------------------------------------------- builders

class GGUF:
    """GGUF bytes written field by field, in either byte order."""

    def __init__(self, order: str = "<"):
        self.order = order
        self.data = bytearray()

    def raw(self, data: bytes) -> GGUF:
        self.data += data
        return self

    def u32(self, value: int) -> GGUF:
        return self.raw(struct.pack(self.order + "I", value))

    def u64(self, value: int) -> GGUF:
        return self.raw(struct.pack(self.order + "Q", value))

    def string(self, text: str | bytes, length: int | None = None) -> GGUF:
        data = text.encode() if isinstance(text, str) else text
        return self.u64(len(data) if length is None else length).raw(data)

    def header(self, n_tensors: int, n_kv: int, version: int = 3) -> GGUF:
        return self.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)

    def kv(self, key: str, vtype: int, value: bytes) -> GGUF:
        return self.string(key).u32(vtype).raw(value)

    def tensor(self, name: str, dims: list[int], type_id: int, offset: int) -> GGUF:
        self.string(name).u32(len(dims))
        for dim in dims:
            self.u64(dim)
        return self.u32(type_id).u64(offset)

    def pad(self, alignment: int = 32) -> GGUF:
        return self.raw(bytes(-len(self.data) % alignment))

    def bytes(self) -> bytes:
        return bytes(self.data)


def le(fmt: str, *values: int) -> bytes:
    return struct.pack("<" + fmt, *values)


def one_tensor(dims: list[int], type_id: int = F32, kvs: tuple = ()) -> bytes:
    g = GGUF().header(1, len(kvs))
    for key, vtype, value in kvs:
        g.kv(key, vtype, value)
    return g.tensor("t", dims, type_id, 0).pad().raw(bytes(64)).bytes()


def nested_arrays(depth: int) -> bytes:
    """An ARRAY value holding one ARRAY ... ``depth`` levels, the innermost an empty u8 array."""
    return b"".join(le("IQ", ARRAY, 1) for _ in range(depth - 1)) + le("IQ", UINT8, 0)


def safetensors(header: bytes | str | object, data: bytes = b"", length: int | None = None) -> bytes:
    if not isinstance(header, (bytes, str)):
        header = json.dumps(header)
    text = header.encode() if isinstance(header, str) else header
    return le("Q", len(text) if length is None else length) + text + data


def entry(dtype: str = "F32", shape: object = (2,), offsets: object = (0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


# ------------------------------------------------------------------------------------------ the corpus

@dataclass(frozen=True)
class Case:
    """A hostile file; ``reason``: what its format's reader says; ``opened``: what ckptfs.open says, where the
    content detection already refuses it (then it never reaches the reader)."""

    data: bytes
    fmt: str                 # "gguf", "safetensors", or "" for neither
    reason: str
    opened: str | None = None

    @property
    def open_reason(self) -> str:
        return self.opened or self.reason


NOT_DETECTED = "not a GGUF or safetensors file"
BIG = 2**63


def gg(data: bytes, reason: str, opened: str | None = None) -> Case:
    return Case(data, "gguf", reason, opened)


def st(data: bytes, reason: str, opened: str | None = None) -> Case:
    return Case(data, "safetensors", reason, opened)


def kv_only(key: str, vtype: int, value: bytes, pad: bool = True) -> bytes:
    g = GGUF().header(0, 1).kv(key, vtype, value)
    return (g.pad() if pad else g).bytes()


def alignment(vtype: int, value: bytes) -> bytes:
    return one_tensor([4], kvs=(("general.alignment", vtype, value),))


CORPUS: dict[str, Case] = {
    # -- GGUF: magic and version
    "gguf bad magic": gg(b"GGUX" + bytes(60), "bad magic", NOT_DETECTED),
    "gguf lower-case magic": gg(b"gguf" + le("I", 3) + bytes(16), "bad magic", NOT_DETECTED),
    "gguf magic only": gg(b"GGUF", "header cut short"),
    "gguf version 1": gg(b"GGUF" + le("IIQ", 1, 0, 0) + bytes(8), "version 1 is the obsolete v1 format"),
    "gguf version 0": gg(GGUF().header(0, 0, version=0).bytes(), "unsupported GGUF version 0"),
    "gguf version 4": gg(GGUF().header(0, 0, version=4).bytes(), "unsupported GGUF version 4"),
    "gguf version 2^31": gg(GGUF().header(0, 0, version=2**31).bytes(), "unsupported GGUF version"),
    "gguf big-endian version 1": gg(GGUF(">").header(0, 0, version=1).bytes(), "version 1 is the obsolete"),
    "gguf big-endian version 7": gg(GGUF(">").header(0, 0, version=7).bytes(), "unsupported GGUF version 7"),
    # -- GGUF: counts and lengths larger than the file
    "gguf 2^63 tensors": gg(GGUF().header(BIG, 0).pad().bytes(), "cannot fit"),
    "gguf 2^64-1 tensors": gg(GGUF().header(2**64 - 1, 0).pad().bytes(), "cannot fit"),
    "gguf 2^63 metadata entries": gg(GGUF().header(0, BIG).pad().bytes(), "cannot fit"),
    "gguf big-endian 2^63 tensors": gg(GGUF(">").header(BIG, 0).pad().bytes(), "cannot fit"),
    "gguf one tensor missing": gg(GGUF().header(1, 0).pad().bytes(), "cannot fit"),
    "gguf key length 2^63": gg(GGUF().header(0, 1).string("", BIG).raw(bytes(16)).bytes(), "exceeds"),
    "gguf key length 2^64-1": gg(GGUF().header(0, 1).string("", 2**64 - 1).raw(bytes(16)).bytes(), "exceeds"),
    "gguf key longer than the file": gg(GGUF().header(0, 1).string("abc", 1000).raw(bytes(16)).bytes(), "exceeds"),
    "gguf string value 2^63": gg(kv_only("k", STRING, le("Q", BIG) + bytes(8), pad=False), "exceeds"),
    "gguf u8 array of 2^62": gg(kv_only("k", ARRAY, le("IQ", UINT8, 2**62)), "needs at least"),
    "gguf string array of 2^63": gg(kv_only("k", ARRAY, le("IQ", STRING, BIG)), "needs at least"),
    "gguf string array of 2^64-1": gg(kv_only("k", ARRAY, le("IQ", STRING, 2**64 - 1)), "needs at least"),
    "gguf array of 2^60 arrays": gg(kv_only("k", ARRAY, le("IQ", ARRAY, 2**60)), "needs at least"),
    "gguf string element past the end": gg(kv_only("k", ARRAY, le("IQ", STRING, 2) + le("Q", 1) + b"a"
                                                   + le("Q", 2**40), pad=False), "exceeds"),
    "gguf tensor name 2^63": gg(GGUF().header(1, 0).string("", BIG).raw(bytes(32)).bytes(), "exceeds"),
    "gguf 2^32-1 dimensions": gg(GGUF().header(1, 0).string("t").u32(2**32 - 1).raw(bytes(40)).bytes(),
                                 "dimensions"),
    "gguf dims cut short": gg(GGUF().header(1, 0).string("t").u32(4).u64(1).raw(bytes(4)).bytes(),
                              "header cut short"),
    "gguf unknown value type": gg(kv_only("k", 13, bytes(8)), "unknown value type 13"),
    "gguf value type 2^32-1": gg(kv_only("k", 2**32 - 1, bytes(8)), "unknown value type"),
    "gguf unknown array element type": gg(kv_only("k", ARRAY, le("IQ", 99, 1) + bytes(8)),
                                          "unknown array element type 99"),
    # -- GGUF: alignment
    "gguf alignment 0": gg(alignment(UINT32, le("I", 0)), "non-zero power of two"),
    "gguf alignment 3": gg(alignment(UINT32, le("I", 3)), "non-zero power of two"),
    "gguf alignment 48": gg(alignment(UINT32, le("I", 48)), "non-zero power of two"),
    "gguf alignment 2^63+1": gg(alignment(UINT64, le("Q", BIG + 1)), "non-zero power of two"),
    "gguf alignment signed": gg(alignment(INT32, le("i", 32)), "unsigned integer"),
    "gguf alignment string": gg(alignment(STRING, le("Q", 2) + b"32"), "unsigned integer"),
    # -- GGUF: shapes
    "gguf dims product 2^64": gg(one_tensor([2**32, 2**32]), "more elements than int64"),
    "gguf dims product 2^63": gg(one_tensor([2**31, 2**32]), "more elements than int64"),
    "gguf dims product past 2^64 late": gg(one_tensor([3, 5, 2**62, 7]), "more elements than int64"),
    "gguf dim 2^64-1": gg(one_tensor([2**64 - 1]), "overflows int64"),
    "gguf Q8_0 bytes overflow": gg(one_tensor([2**63 - 32], Q8_0), "overflows int64"),
    "gguf Q4_K row of 255": gg(one_tensor([255, 2], Q4_K), "not a multiple of the Q4_K block size 256"),
    "gguf nine dimensions": gg(one_tensor([1] * 9), "dimensions"),
    # -- GGUF: nesting and duplicates
    "gguf arrays nested 9 deep": gg(kv_only("k", ARRAY, nested_arrays(9)), "nested deeper"),
    "gguf arrays nested 100000 deep": gg(kv_only("k", ARRAY, nested_arrays(100_000)), "nested deeper"),
    "gguf duplicate key": gg(GGUF().header(0, 2).kv("k", UINT8, b"\x01").kv("k", UINT8, b"\x02").pad().bytes(),
                             "duplicate metadata key"),
    # -- safetensors: the header itself
    "st file of 5 bytes": st(b"\x10\x00\x00\x00\x00", "header too small", NOT_DETECTED),
    "st header length 2^63": st(safetensors({}, length=BIG), "exceeds the safetensors limit"),
    "st header length over the cap": st(safetensors("{" + " " * 64, length=100_000_001),
                                        "exceeds the safetensors limit"),
    "st header longer than the file": st(safetensors('{"a": 1}', length=5000), "header cut short"),
    "st header bad UTF-8": st(safetensors(b'{"t\xff\xfe": ' + json.dumps(entry()).encode() + b"}", bytes(8)),
                              "not valid UTF-8"),
    "st header overlong UTF-8": st(safetensors(b'{"\xc0\xaf": 1}'), "not valid UTF-8"),
    "st header lone surrogate escape": st(safetensors('{"\\ud800": ' + json.dumps(entry()) + "}", bytes(8)),
                                          "surrogate"),
    "st header a JSON list": st(safetensors("[1, 2]"), "must be a JSON object", NOT_DETECTED),
    "st header a JSON string": st(safetensors('"abc"'), "must be a JSON object", NOT_DETECTED),
    "st header JSON null": st(safetensors("null"), "must be a JSON object", NOT_DETECTED),
    "st header truncated JSON": st(safetensors('{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'),
                                   "not valid JSON"),
    "st header trailing garbage": st(safetensors('{"t": ' + json.dumps(entry()) + "} x", bytes(8)),
                                     "not valid JSON"),
    "st header NaN": st(safetensors('{"__metadata__": {"a": NaN}}'), "not valid JSON"),
    "st header number 1e400": st(safetensors('{"t": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}'),
                                 "not valid JSON"),
    "st header nested 200 deep": st(safetensors('{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": '
                                                + "[" * 200 + "]" * 200 + "}}", bytes(8)), "nested deeper"),
    "st header nested 100000 deep": st(safetensors('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                                       "nested deeper"),
    # -- safetensors: the entry schema
    "st entry not an object": st(safetensors({"t": [1, 2]}), "entry must be an object"),
    "st entry missing dtype": st(safetensors({"t": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
                                 "missing field 'dtype'"),
    "st entry missing offsets": st(safetensors({"t": {"dtype": "F32", "shape": [2]}}, bytes(8)),
                                   "missing field 'data_offsets'"),
    # a dtype *name* ckptfs does not know is served raw-only (tests/formats/test_safetensors_reader.py), not refused
    "st entry dtype a number": st(safetensors({"t": entry(7)}, bytes(8)), "unknown dtype 7"),
    "st entry negative dim": st(safetensors({"t": entry(shape=[-2])}, bytes(8)), "shape must be"),
    "st entry float dim": st(safetensors({"t": entry(shape=[2.0])}, bytes(8)), "shape must be"),
    "st entry dim 2^64": st(safetensors({"t": entry(shape=[2**64])}, bytes(8)), "shape must be"),
    "st entry shape a string": st(safetensors({"t": entry(shape="2")}, bytes(8)), "shape must be"),
    "st entry three offsets": st(safetensors({"t": entry(offsets=[0, 4, 8])}, bytes(8)), "data_offsets must be"),
    "st entry negative offset": st(safetensors({"t": entry(offsets=[-8, 0])}, bytes(8)), "data_offsets must be"),
    "st duplicate __metadata__": st(safetensors('{"__metadata__": {}, "__metadata__": {}}'),
                                    "duplicate __metadata__"),
    "st __metadata__ not strings": st(safetensors({"__metadata__": {"a": 1}}), "must be a string"),
    # -- safetensors: layout and sizes
    "st offsets not from 0": st(safetensors({"t": entry(offsets=(8, 16))}, bytes(16)), "contiguous from 0"),
    "st offsets with a gap": st(safetensors({"a": entry(offsets=(0, 8)), "b": entry(offsets=(12, 20))}, bytes(20)),
                                "contiguous from 0"),
    "st offsets overlapping": st(safetensors({"a": entry(offsets=(0, 8)), "b": entry(offsets=(4, 12))}, bytes(12)),
                                 "contiguous from 0"),
    "st offsets end before begin": st(safetensors({"a": entry(offsets=(0, 8)), "b": entry(offsets=(8, 4))},
                                                  bytes(8)), "contiguous from 0"),
    "st size mismatch": st(safetensors({"t": entry(shape=(2, 2), offsets=(0, 12))}, bytes(12)), "needs 16 bytes"),
    "st F4 half a byte": st(safetensors({"t": entry("F4", shape=(3,), offsets=(0, 2))}, bytes(2)),
                            "not a whole number of bytes"),
    "st shape overflows 64 bits": st(safetensors({"t": entry(shape=(2**32, 2**32, 2), offsets=(0, 8))}, bytes(8)),
                                     "overflows 64 bits"),
    "st bytes overflow 64 bits": st(safetensors({"t": entry("F64", shape=(2**62,), offsets=(0, 8))}, bytes(8)),
                                    "overflows 64 bits"),
    # -- neither format
    "empty file": Case(b"", "", "empty file"),
    "zip archive": Case(b"PK\x03\x04" + bytes(40), "", "zip archive"),
    "pickle": Case(b"\x80\x04\x95" + bytes(40), "", "Python pickle"),
}


# ------------------------------------------------------------------------------------------- checks

READERS: dict[str, Callable[[str], object]] = {"gguf": read_gguf, "safetensors": read_safetensors}
SUFFIXES = {"gguf": ".gguf", "safetensors": ".safetensors", "": ".bin"}


class Hang(Exception):
    pass


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_GUARD_SECONDS) -> Iterator[None]:
    """Fail a call that runs longer than ``seconds`` (a hang, not a slow machine: refusals take milliseconds).

    pytest-timeout may own SIGALRM already: its handler and remaining time are put back afterwards.
    """
    def on_alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, outer - (time.monotonic() - start)))


def refusal(call: Callable[[str], object], path: Path) -> CheckpointError:
    with hang_guard():
        with pytest.raises(CheckpointError) as info:
            call(str(path))
    return info.value


def check_refusal(exc: CheckpointError, path: Path, phrase: str) -> None:
    """Names the file first, gives the reason in one line, and comes from an explicit check: the readers'
    last-resort conversion of an unexpected exception (``unreadable header (...)``) chains its cause."""
    message = str(exc)
    assert message.startswith(str(path)), message
    assert phrase in exc.reason, message
    assert "\n" not in message
    assert exc.__cause__ is None, f"refused by the catch-all, not by a check: {message}"


def write_case(folder: Path, name: str) -> Path:
    case = CORPUS[name]
    path = folder / (name.replace(" ", "_").replace("^", "e") + SUFFIXES[case.fmt])
    path.write_bytes(case.data)
    return path


@pytest.mark.parametrize("name", list(CORPUS))
def test_refused_by_its_reader_and_by_open(tmp_path, name):
    case = CORPUS[name]
    path = write_case(tmp_path, name)
    if case.fmt:
        check_refusal(refusal(READERS[case.fmt], path), path, case.reason)
    check_refusal(refusal(ckptfs.open, path), path, case.open_reason)


def test_corpus_covers_both_formats_and_every_contract_rule():
    reasons = " | ".join(case.reason for case in CORPUS.values())
    for rule in ("bad magic", "unsupported GGUF version", "version 1", "cannot fit", "exceeds", "header cut short",
                 "non-zero power of two", "more elements than int64", "nested deeper", "exceeds the safetensors "
                 "limit", "not valid UTF-8", "must be a JSON object", "entry must be an object", "unknown dtype",
                 "contiguous from 0", "needs 16 bytes", "overflows 64 bits"):
        assert rule in reasons, rule


# ------------------------------------------------------------------------------ a header cut anywhere

def small_gguf(order: str = "<") -> tuple[bytes, int, dict[str, tuple[int, int]]]:
    """A small valid GGUF: (bytes, end of the tensor infos, tensor name -> (offset, stored bytes))."""
    g = GGUF(order).header(2, 3)
    g.kv("general.architecture", STRING, struct.pack(order + "Q", 4) + b"test")
    g.kv("a.words", ARRAY, struct.pack(order + "IQQ", STRING, 2, 1) + b"x" + struct.pack(order + "Q", 2) + b"yz")
    g.kv("a.numbers", ARRAY, struct.pack(order + "IQ3I", UINT32, 3, 1, 2, 3))
    g.tensor("w", [32], Q8_0, 0).tensor("b", [4], F32, 64)
    info_end = len(g.data)
    g.pad()
    data_start = len(g.data)
    block = bytearray(34)
    block[0:2] = struct.pack(order + "e", 0.5)
    g.raw(bytes(block)).pad().raw(struct.pack(order + "4f", 1, 2, 3, 4))
    return g.bytes(), info_end, {"w": (data_start, 34), "b": (data_start + 64, 16)}


def small_safetensors() -> tuple[bytes, int, dict[str, tuple[int, int]]]:
    header = {"__metadata__": {"k": "v"}, "a": entry("F32", (2,), (0, 8)), "b": entry("U8", (3,), (8, 11))}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = struct.pack("<2f", 1.5, -2) + b"\x01\x02\x03"
    start = 8 + len(text)
    return safetensors(text, data), start, {"a": (start, 8), "b": (start + 8, 3)}


@pytest.mark.parametrize("kind", ["gguf", "gguf big-endian", "safetensors"])
def test_header_cut_at_every_byte(tmp_path, kind):
    """Every cut inside the header is refused; every cut after it opens, with exactly the tensors whose bytes
    are not all there marked damaged: the line between refusing and serving lies where the header ends."""
    if kind == "safetensors":
        full, header_end, tensors = small_safetensors()
        suffix = ".safetensors"
    else:
        full, header_end, tensors = small_gguf(">" if "big" in kind else "<")
        suffix = ".gguf"
    assert ckptfs.open(_write(tmp_path / ("whole" + suffix), full)).damaged() == []
    path = tmp_path / ("cut" + suffix)
    for cut in range(len(full)):
        _write(path, full[:cut])
        if cut < header_end:
            exc = refusal(ckptfs.open, path)
            assert str(exc).startswith(str(path)) and exc.__cause__ is None, (cut, str(exc))
            continue
        with hang_guard(), ckptfs.open(str(path)) as ck:
            assert [t.name for t in ck.tensors] == list(tensors), cut
            damaged = {t.name for t in ck.damaged()}
            assert damaged == {name for name, (offset, size) in tensors.items() if offset + size > cut}, cut


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


# ------------------------------------------------------------------------------------------ the CLI

def run_cli_in_process(capfd, *args: str) -> tuple[int, str, str]:
    with hang_guard(), pytest.raises(SystemExit) as info:
        cli_main(list(args), prog_name="ckptfs")
    out, err = capfd.readouterr()
    return info.value.code, out, err


def check_one_line(code: int, out: str, err: str, path: Path, phrase: str) -> None:
    assert out == "", out
    assert err.endswith("\n"), err
    assert one_error_line(subprocess.CompletedProcess([], code, out, err), 1, phrase).startswith(f"ckptfs: error: {path}")


@pytest.mark.parametrize("name", list(CORPUS))
def test_info_and_mount_print_one_line_and_exit_1(tmp_path, capfd, name):
    """In-process (the corpus is large; a process start costs about a second here): the same code path as
    the command, up to the exit status and what reaches file descriptors 1 and 2."""
    path = write_case(tmp_path, name)
    phrase = CORPUS[name].open_reason
    check_one_line(*run_cli_in_process(capfd, "info", str(path)), path, phrase)
    check_one_line(*run_cli_in_process(capfd, "info", "--json", str(path)), path, phrase)
    if fuse_problem() is None:
        mountpoint = tmp_path / "mnt"
        mountpoint.mkdir()
        check_one_line(*run_cli_in_process(capfd, "mount", str(path), str(mountpoint)), path, phrase)
        assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []


@pytest.mark.parametrize("name", ["gguf 2^63 tensors", "gguf alignment 0", "st offsets with a gap",
                                  "st header bad UTF-8"])
def test_real_commands_print_one_line_and_exit_1(tmp_path, name):
    """A sample through real processes: ``ckptfs info`` and ``ckptfs mount`` (daemon mode and -f)."""
    require_fuse()
    path = write_case(tmp_path, name)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    for args in (["info", str(path)], ["mount", str(path), str(mountpoint)],
                 ["mount", "-f", str(path), str(mountpoint)]):
        result = subprocess.run([*ckptfs_cli(), *args], env=cli_env(), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=60)
        check_one_line(result.returncode, result.stdout, result.stderr, path, CORPUS[name].open_reason)
        assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []
