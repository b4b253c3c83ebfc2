"""Property-based fuzzing (hypothesis) of each reader: GGUF, safetensors, and the sharded-checkpoint index.

Valid seed files written by the references are mutated — byte edits biased to the header, interesting integers
in either byte order, cuts, insertions; for safetensors also edits of the parsed header; for the index, edits
of its JSON document — and opened as a user would (see ``fuzz_harness.exercise``): only ``CheckpointError``
may come out, never from the readers' catch-all, and no input may run for more than a few CPU seconds.
Hypothesis shrinks a failure to a minimal edit list and prints it; the file is also left in the test's
temporary directory.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
from fuzz_harness import Hang, cpu_alarm, exercise, mutate_bytes, mutate_index, mutate_safetensors_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seeds import gguf_seeds, index_seed, safetensors_seeds

#: Examples per property; CKPTFS_FUZZ_EXAMPLES raises it for a longer hunt (the default takes seconds).
EXAMPLES = int(os.environ.get("CKPTFS_FUZZ_EXAMPLES", "500"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Seeds(dict):
    """Per format: [(seed bytes, where its header ends - four mutations in five land before that)]."""

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example: not the files
        return f"<seeds: {', '.join(f'{len(v)} {k}' for k, v in self.items())}>"


@pytest.fixture(scope="module")
def seed_files(tmp_path_factory) -> Seeds:
    folder = tmp_path_factory.mktemp("seeds")
    ggufs = [(p.read_bytes(), start) for p, start in gguf_seeds(folder / "gguf")]
    sts = [(data, 8 + struct.unpack_from("<Q", data, 0)[0])
           for data in (p.read_bytes() for p in safetensors_seeds(folder / "st"))]
    return Seeds(gguf=ggufs, safetensors=sts)




def check(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    with cpu_alarm():
        return exercise(path)


@FUZZ
@given(which=st.integers(0, 3), rng=st.randoms(use_true_random=False))
def test_gguf_reader(seed_files, tmp_path, which, rng: random.Random):
    seed, header_end = seed_files["gguf"][which]
    check(tmp_path / "fuzz.gguf", mutate_bytes(seed, rng, header_end))


@FUZZ
@given(which=st.integers(0, 1), rng=st.randoms(use_true_random=False))
def test_safetensors_reader_bytes(seed_files, tmp_path, which, rng: random.Random):
    seed, header_end = seed_files["safetensors"][which]
    check(tmp_path / "fuzz.safetensors", mutate_bytes(seed, rng, header_end))


@FUZZ
@given(which=st.integers(0, 1), rng=st.randoms(use_true_random=False))
def test_safetensors_reader_header_edits(seed_files, tmp_path, which, rng: random.Random):
    check(tmp_path / "fuzz.safetensors", mutate_safetensors_header(seed_files["safetensors"][which][0], rng))


@pytest.fixture(scope="module")
def index_folder(tmp_path_factory) -> tuple[Path, dict, list[str]]:
    return index_seed(tmp_path_factory.mktemp("index"))


@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(rng=st.randoms(use_true_random=False))
def test_index_reader(index_folder, rng: random.Random):
    index, doc, shards = index_folder
    target = index.with_name("fuzz.safetensors.index.json")
    try:
        check(target, mutate_index(doc, rng, shards))
    finally:
        target.unlink(missing_ok=True)


def test_seeds_open_cleanly(seed_files, index_folder, tmp_path):
    """The property holds vacuously if every input is refused: the unmutated seeds must open."""
    for kind, seeds in seed_files.items():
        for i, (seed, _) in enumerate(seeds):
            assert check(tmp_path / f"seed{i}.{kind}", seed) == "opened", (kind, i)
    assert exercise(index_folder[0]) == "opened"


def test_mutations_reach_both_outcomes(seed_files, tmp_path):
    """A fixed sample of mutated files: some must open and some be refused, or the mutations miss the header."""
    rng = random.Random(1)
    seed, header_end = seed_files["gguf"][0]
    outcomes = {check(tmp_path / "m.gguf", mutate_bytes(seed, rng, header_end)) for _ in range(60)}
    seed = seed_files["safetensors"][0][0]
    outcomes |= {check(tmp_path / "m.safetensors", mutate_safetensors_header(seed, rng)) for _ in range(60)}
    assert outcomes == {"opened", "refused"}


def test_cpu_alarm_stops_a_runaway_input():
    """The per-input guard itself: a busy loop is interrupted with Hang (a finding), not waited for."""
    with pytest.raises(Hang), cpu_alarm(0.2):
        while True:
            pass
