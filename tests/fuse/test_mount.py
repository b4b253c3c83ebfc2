"""Real mounts (daemon mode, default binding): every file equals its reference, byte for byte.

What each mount must show is spelled out in tests/mount_expect.py, independently of ckptfs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import mount_stats, skip_or_fail
from fixtures import Written, write_all_dtypes_safetensors, write_gguf, write_mixed_gguf
from mount_expect import (Expected, WRITE_ATTEMPTS, big_tensors, check_np_load, check_tree, expected_gguf,
                          expected_safetensors, odd_ranges, read_direct)


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> Written:
    return write_mixed_gguf(tmp_path_factory.mktemp("src") / "mixed.gguf")


@pytest.fixture(scope="module")
def st_file(tmp_path_factory) -> Written:
    return write_all_dtypes_safetensors(tmp_path_factory.mktemp("src") / "all.safetensors")


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory) -> Written:
    return write_gguf(tmp_path_factory.mktemp("src") / "big.gguf", big_tensors(), {"general.name": "big"})


@pytest.fixture(scope="module")
def gguf_mount(module_mounted, mixed_gguf) -> tuple[Path, Expected]:
    src = str(mixed_gguf.path)
    return module_mounted(src), expected_gguf(mixed_gguf, src)


@pytest.fixture(scope="module")
def st_mount(module_mounted, st_file) -> tuple[Path, Expected]:
    src = str(st_file.path)
    return module_mounted(src), expected_safetensors(st_file, src)


@pytest.fixture(scope="module")
def big_mount(module_mounted, big_gguf) -> tuple[Path, Expected]:
    src = str(big_gguf.path)
    return module_mounted(src, "--cache-size", "64M"), expected_gguf(big_gguf, src)


# ------------------------------------------------------------------------------------------ tests


def test_gguf_every_file_equals_reference(gguf_mount):
    mnt, expected = gguf_mount
    assert not expected.unchecked  # gguf-py decodes every type in this fixture
    check_tree(mnt, expected)


def test_safetensors_every_file_equals_reference(st_mount):
    mnt, expected = st_mount
    check_tree(mnt, expected)


def test_np_load_with_and_without_mmap(gguf_mount, st_mount):
    for mnt, expected in (gguf_mount, st_mount):
        check_np_load(mnt, expected)


def test_attributes(big_mount, big_gguf):
    mnt, expected = big_mount
    src_mtime = os.stat(big_gguf.path).st_mtime
    root = os.stat(mnt)
    # r-x for the file's readers, walled in by the folders above it: pytest's are 0700, so only the owner's
    assert stat.S_ISDIR(root.st_mode) and stat.S_IMODE(root.st_mode) == 0o500 and root.st_nlink == 2
    for name in sorted(expected.names):
        st = os.stat(mnt / name)
        size = len(expected.data[name]) if name in expected.data else st.st_size
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444, name
        assert st.st_size == size and st.st_blocks == -(-size // 512) and st.st_nlink == 1, name
        assert abs(st.st_mtime - src_mtime) < 1e-6, name
        assert st.st_uid == os.getuid() and st.st_gid == os.getgid()
    vfs = os.statvfs(mnt)
    assert vfs.f_namemax == 255 and vfs.f_bavail == 0 and vfs.f_files == len(expected.names) + 1
    assert vfs.f_flag & os.ST_RDONLY


def test_sizes_exact_from_the_first_lookup(mounted, big_gguf):
    """Nothing read before: stat alone must give the final size (mmap and the page cache trust it)."""
    mnt = mounted(str(big_gguf.path))
    expected = expected_gguf(big_gguf, str(big_gguf.path))
    for name in sorted(expected.names):
        size = os.stat(mnt / name).st_size
        length = len(expected.data[name]) if name in expected.data else len((mnt / name).read_bytes())
        assert size == length, name


def test_reads_at_odd_offsets_and_sizes(big_mount):
    mnt, expected = big_mount
    rng = np.random.default_rng(11)
    for name in ("big.q4_k.npy", "big.q6_k.npy", "big.bf16.npy", "big.f16.npy", "big.q8_0.raw", "big.f32.npy"):
        data = expected.data[name]
        header = len(data) - expected.arrays[name].nbytes if name.endswith(".npy") else 0
        block_out = 1024 if "_k" in name else 128
        ranges = odd_ranges(len(data), max(header, 1), block_out, rng)
        for (offset, size), got in zip(ranges, read_direct(mnt / name, ranges)):
            assert got == data[offset: offset + size], (name, offset, size)
        with open(mnt / name, "rb") as fh:  # through the page cache
            for offset, size in ranges[:20]:
                fh.seek(offset)
                assert fh.read(size) == data[offset: offset + size], (name, offset, size)


def test_cp_r_and_sha256sum(big_mount, gguf_mount, tmp_path):
    for mnt, expected in (big_mount, gguf_mount):
        copy = tmp_path / mnt.name
        subprocess.run(["cp", "-r", str(mnt), str(copy)], check=True)
        assert set(os.listdir(copy)) == expected.names
        for name, data in expected.data.items():
            assert (copy / name).read_bytes() == data, name
        for name, value in expected.json.items():
            assert json.loads((copy / name).read_bytes()) == value, name
        names = sorted(expected.data)
        out = subprocess.run(["sha256sum", *names], cwd=mnt, check=True, capture_output=True, text=True).stdout
        sums = dict(line.split("  ", 1)[::-1] for line in out.splitlines())
        assert sums == {n: hashlib.sha256(expected.data[n]).hexdigest() for n in names}


def test_concurrent_readers_threads(big_mount):
    mnt, expected = big_mount
    names = sorted(n for n in expected.data if n.startswith("big."))
    failures: list[str] = []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                name = names[int(rng.integers(len(names)))]
                data = expected.data[name]
                offset, size = int(rng.integers(0, len(data))), int(rng.integers(1, 200_000))
                if read_direct(mnt / name, [(offset, size)])[0] != data[offset: offset + size]:
                    failures.append(f"{name} {offset}+{size}")
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


_PROCESS_READER = """
import hashlib, sys, numpy as np
path, direct = sys.argv[1], sys.argv[2] == "direct"
if direct:
    import os
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT); chunks = []; offset = 0
    while True:
        chunk = os.pread(fd, 77777, offset)
        if not chunk: break
        chunks.append(chunk); offset += len(chunk)
    print(hashlib.sha256(b"".join(chunks)).hexdigest())
else:
    a = np.load(path, mmap_mode="r"); print(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
"""


def test_concurrent_readers_processes(mounted, big_gguf):
    mnt = mounted(str(big_gguf.path))  # fresh: nothing in the page cache yet
    expected = expected_gguf(big_gguf, str(big_gguf.path))
    jobs = []
    for i, name in enumerate(["big.q4_k.npy", "big.q4_k.npy", "big.q6_k.npy", "big.bf16.npy"]):
        mode = "direct" if i % 2 == 0 else "mmap"
        want = (expected.data[name] if mode == "direct" else expected.arrays[name].tobytes())
        proc = subprocess.Popen([sys.executable, "-c", _PROCESS_READER, str(mnt / name), mode],
                                stdout=subprocess.PIPE, text=True)
        jobs.append((proc, hashlib.sha256(want).hexdigest()))
    for proc, digest in jobs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == digest


@pytest.mark.parametrize("mode", ["float32", "float16"])
def test_dtype_modes(module_mounted, mixed_gguf, st_file, mode):
    for written, build in ((mixed_gguf, expected_gguf), (st_file, expected_safetensors)):
        src = str(written.path)
        mnt = module_mounted(src, "--dtype", mode)
        expected = build(written, src, mode)
        check_tree(mnt, expected)
        check_np_load(mnt, expected)
        if written is mixed_gguf:  # the rule itself, spelled out on a few tensors
            dtypes = {n: np.load(mnt / f"{n}.npy", mmap_mode="r").dtype.str
                      for n in ("q4_k.mat", "bf16.mat", "f16.mat", "f32.vec", "i32.mat")}
            assert dtypes == {"q4_k.mat": "<f2" if mode == "float16" else "<f4",
                              "bf16.mat": "<f2" if mode == "float16" else "<f4",
                              "f16.mat": "<f4" if mode == "float32" else "<f2", "f32.vec": "<f4", "i32.mat": "<i4"}


def test_kernel_page_cache_survives_reopen(mounted, big_gguf):
    """kernel_cache: a second open reads from the page cache, so the daemon's block cache sees nothing."""
    mnt = mounted(str(big_gguf.path))
    path = mnt / "big.q4_k.npy"
    path.read_bytes()
    before = mount_stats(mnt)["cache"]
    assert before["misses"] > 0
    for _ in range(3):
        path.read_bytes()
        np.load(path, mmap_mode="r").sum()
    after = mount_stats(mnt)["cache"]
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])


def test_stats_xattr(gguf_mount):
    mnt, _ = gguf_mount
    stats = mount_stats(mnt)
    assert {"cache", "pid", "binding", "libfuse"} <= set(stats)
    assert os.listxattr(mnt) == ["user.ckptfs.stats"]
    assert os.listxattr(mnt / "metadata.json") == []
    for path, attr in ((mnt, "user.other"), (mnt / "f32.vec.raw", "user.ckptfs.stats")):
        with pytest.raises(OSError) as info:
            os.getxattr(path, attr)
        assert info.value.errno == errno.ENODATA


def test_lookups_outside_the_tree_fail(gguf_mount):
    mnt, _ = gguf_mount
    for name, code in (("nope.npy", errno.ENOENT), ("f32.vec.raw/x", errno.ENOTDIR),
                       ("f32.vec", errno.ENOENT), (".npy", errno.ENOENT)):
        with pytest.raises(OSError) as info:
            os.stat(mnt / name)
        assert info.value.errno == code, name
    assert os.path.samefile(mnt / "..", mnt.parent)


@pytest.mark.parametrize("attempt", sorted(WRITE_ATTEMPTS))
def test_writes_fail_with_erofs(gguf_mount, attempt):
    mnt, _ = gguf_mount
    with pytest.raises(OSError) as info:
        WRITE_ATTEMPTS[attempt](mnt)
    assert info.value.errno == errno.EROFS, attempt


@pytest.mark.parametrize("command", [["touch", "{m}/f32.vec.raw"], ["touch", "{m}/new"], ["mkdir", "{m}/d"],
                                     ["rm", "-f", "{m}/f32.vec.raw"], ["mv", "{m}/f32.vec.raw", "{m}/y"],
                                     ["chmod", "600", "{m}/f32.vec.raw"], ["truncate", "-s", "0", "{m}/f32.vec.raw"],
                                     ["setfattr", "-n", "user.x", "-v", "1", "{m}/f32.vec.raw"]])
def test_write_tools_fail_read_only(gguf_mount, command):
    mnt, _ = gguf_mount
    if shutil.which(command[0]) is None:
        skip_or_fail(f"{command[0]} is not installed (Debian: apt-get install attr coreutils)")
    result = subprocess.run([c.format(m=mnt) for c in command], capture_output=True, text=True)
    assert result.returncode != 0 and "Read-only file system" in result.stderr, result.stderr
    assert (mnt / "f32.vec.raw").stat().st_size == 28


# ------------------------------------------------------------------------------------------ names


def _patch_names(path: Path, renames: dict[str, bytes]) -> None:
    """Give tensors names gguf-py refuses to write (duplicates, invalid UTF-8) by patching the header."""
    data = bytearray(path.read_bytes())
    for old, new in renames.items():
        assert len(old.encode()) == len(new)
        prefix = len(new).to_bytes(8, "little")
        at = data.index(prefix + old.encode())
        data[at + 8: at + 8 + len(new)] = new
    path.write_bytes(bytes(data))


def test_weird_names_map_as_the_contract_says(mounted, tmp_path):
    rng = np.random.default_rng(3)
    long_name = "é" * 150  # 300 bytes: too long once ".meta.json" is added
    stems = {"a/b": "a%2Fb", "100%": "100%25", "..": "..", ".": ".", "sp ace\ttab": "sp ace\ttab",
             "ümlaut.中文": "ümlaut.中文", "nul\x00byte": "nul%00byte", "dupA": "dupA", "dupB": "dupA~2",
             "invXY": "inv%FF%FE",
             long_name: "é" * 100 + "~" + hashlib.sha256(long_name.encode()).hexdigest()[:16]}
    tensors = {name: (rng.standard_normal(4 + i).astype(np.float32), "F32") for i, name in enumerate(stems)}
    written = write_gguf(tmp_path / "names.gguf", tensors)
    # gguf-py refuses duplicate names and cannot write invalid UTF-8: patch them into the header
    _patch_names(written.path, {"dupB": b"dupA", "invXY": b"inv\xff\xfe"})
    real_names = {"dupB": "dupA", "invXY": "inv\udcff\udcfe"}  # invalid bytes kept by surrogateescape
    mnt = mounted(str(written.path))
    want = {stem + suffix for stem in stems.values() for suffix in (".npy", ".raw", ".meta.json")}
    assert set(os.listdir(mnt)) == want | {"metadata.json", "names.gguf"}
    for key, stem in stems.items():
        assert all(len((stem + s).encode()) <= 255 for s in (".npy", ".raw", ".meta.json"))
        meta = json.loads((mnt / f"{stem}.meta.json").read_bytes())
        assert meta["name"] == real_names.get(key, key)
        assert (mnt / f"{stem}.raw").read_bytes() == written.tensors[key].raw
        assert np.load(mnt / f"{stem}.npy").tobytes() == written.tensors[key].array.tobytes()
