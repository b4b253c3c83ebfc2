"""Every open option is reachable from every entry point, and a new one is a change in one place.

``OpenOptions``' fields are walked, so a field added without its spelling, or one a command neither takes
nor says why it leaves out, fails here. Each command is run for real (its own click parsing, its own code
up to the point it hands the options on), with the function it hands them to replaced by a recorder: the
value recorded is the one the command would have opened, mounted or benchmarked with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import click
import pytest

import ckptfs
import ckptfs.bench
import ckptfs.checkpoint.api
import ckptfs.service.mount
from ckptfs.commands.cli import main
from ckptfs.commands.fstab import mount_arguments, parse_helper_argv
from ckptfs.commands.open_flags import open_flags
from ckptfs.core.options import OpenOptions, option, spelled_fields

COMMANDS = ("mount", "info", "bench", "prefetch")


def sample(kind: str, tmp_path) -> tuple[str, object]:
    """A command-line value of each kind and what the options hold for it (a new kind needs one here)."""
    return {
        "text": ("https://mirror.example/m.gguf", "https://mirror.example/m.gguf"),
        "dtype": ("float16", "float16"),
        "size": ("3M", 3 << 20),
        "count": ("7", 7),
        "seconds": ("2.5", 2.5),
        "percent": ("7.5%", 7.5),
        "dir": (str(tmp_path / "cache"), str(tmp_path / "cache")),
        "file": (str(tmp_path / "key"), str(tmp_path / "key")),
        "redis_url": ("redis://127.0.0.1:6399/2", "redis://127.0.0.1:6399/2"),
        "redis_seed": ("127.0.0.1:7001", "127.0.0.1:7001"),
        "flag": ("", True),  # given alone: no value follows the flag (fstab: ``offline`` or ``offline=``)
    }[kind]


def given(spelled, text: str) -> list[str]:
    """The command-line words that give ``text`` to the option ``spelled``."""
    return [spelled.flag] if spelled.kind == "flag" else [spelled.flag, text]


def expected(field, spelled, value):
    return (value,) if spelled.repeat else value


class Recorder:
    """Stands in for what a command hands its options to; keeps the last ``OpenOptions`` it was given."""

    def __init__(self, monkeypatch):
        self.options: OpenOptions | None = None
        recorder = self

        def run_mount(request):
            recorder.options = request.open_options
            return 0

        def opened(src, *args, options=None, **changes):
            recorder.options = options
            raise OSError("recorded")

        def opened_with(src, options, plan=None):
            return opened(src, options=options)

        def run_bench(src, as_json=False, options=None, verbose=False):
            recorder.options = options
            return 0

        monkeypatch.setattr(ckptfs.service.mount, "run_mount", run_mount)
        monkeypatch.setattr(ckptfs, "open", opened)  # info
        monkeypatch.setattr(ckptfs.checkpoint.api, "open_with", opened_with)  # prefetch
        monkeypatch.setattr(ckptfs.bench, "run_bench", run_bench)

    def run(self, command: str, *args: str, src: str = "model.gguf") -> OpenOptions:
        self.options = None
        operands = [src, "/mnt/here"] if command == "mount" else [src]
        base = ["--cache-dir", "/var/cache/ckptfs"] if command == "prefetch" else []  # something to warm
        with pytest.raises(SystemExit):
            main.commands[command].main([*operands, *base, *args], prog_name="ckptfs", standalone_mode=False)
        assert isinstance(self.options, OpenOptions), f"{command} {args} handed on no options"
        return self.options


def omitted(command: str) -> dict[str, str]:
    return main.commands[command].callback.omitted_options


def long_flags(command) -> set[str]:
    return {opt for p in command.params for opt in p.opts if opt.startswith("--")}


def test_every_field_is_spelled():
    for field, spelled in spelled_fields():
        assert spelled.help and spelled.flag.startswith("--"), field.name
    flags = [s.flag for _, s in spelled_fields()]
    assert len(set(flags)) == len(flags)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_field_is_a_flag_of_each_command_or_left_out_with_a_reason(command, tmp_path, monkeypatch):
    pytest.importorskip("redis")  # --redis and --redis-cluster refuse a missing redis-py as a usage error
    recorder = Recorder(monkeypatch)
    flags = long_flags(main.commands[command])
    left_out = omitted(command)
    assert set(left_out) <= {f.name for f, _ in spelled_fields()}
    for field, spelled in spelled_fields():
        if field.name in left_out:
            assert left_out[field.name].strip(), f"{command} leaves out {field.name} without a reason"
            assert spelled.flag not in flags, (command, spelled.flag)
            continue
        text, value = sample(spelled.kind, tmp_path)
        got = recorder.run(command, *given(spelled, text))
        assert getattr(got, field.name) == expected(field, spelled, value), (command, spelled.flag)
    assert not omitted("mount"), "mount takes every open option (the fstab helper's list is mount's)"


def test_every_field_has_its_fstab_option(tmp_path, monkeypatch):
    pytest.importorskip("redis")
    recorder = Recorder(monkeypatch)
    mount = main.commands["mount"]
    for field, spelled in spelled_fields():
        text, value = sample(spelled.kind, tmp_path)
        argv = mount_arguments(parse_helper_argv(["model.gguf", "/mnt/here", "-o", f"{spelled.fstab}={text}"]),
                               mount)
        assert argv[:3] == ["mount", "model.gguf", "/mnt/here"]
        got = recorder.run("mount", *argv[3:], src="model.gguf")
        assert getattr(got, field.name) == expected(field, spelled, value), (spelled.fstab, argv)


def test_options_travel_whole_to_a_mount_the_bench_starts(tmp_path, monkeypatch):
    """``as_flags``: what ``ckptfs bench`` passes to the mounts it starts is the value itself, spelled back."""
    pytest.importorskip("redis")
    recorder = Recorder(monkeypatch)
    changes = {}
    for field, spelled in spelled_fields():
        changes[field.name] = expected(field, spelled, sample(spelled.kind, tmp_path)[1])
    options = OpenOptions.build(**changes)
    assert recorder.run("mount", *options.as_flags()) == options
    assert OpenOptions().as_flags() == []


def test_bench_hands_on_the_value_it_was_given(tmp_path, monkeypatch):
    recorder = Recorder(monkeypatch)
    got = recorder.run("bench", "--cache-size", "8M", "--timeout", "4")
    assert got == OpenOptions.build(cache_size=8 << 20, timeout=4)


@dataclass(frozen=True)
class WithRetries(OpenOptions):
    """An open option added the way every one is: one field with its spelling."""

    read_retries: int | None = option(None, flag="--read-retries", kind="count",
                                      help="Retries of a failed read before EIO.")


def test_a_new_open_option_is_one_field():
    seen = []

    @click.command()
    @open_flags(cls=WithRetries)
    def probe(open_options):
        seen.append(open_options)

    # its flag, with its help
    assert "--read-retries" in long_flags(probe)
    assert "Retries of a failed read before EIO." in probe.get_help(click.Context(probe))
    # the command gets it in the one value
    probe.main(["--read-retries", "3", "--dtype", "float32"], standalone_mode=False)
    assert seen[-1] == WithRetries.build(read_retries=3, dtype="float32")
    # its fstab -o name
    argv = mount_arguments(parse_helper_argv(["s", "m", "-o", "read_retries=3,cache_size=1M"]), probe)
    assert argv == ["mount", "s", "m", "--read-retries", "3", "--cache-size", "1M"]
    # its open() keyword (the signature is generated) and its spelling back to a command line
    signature = ckptfs.checkpoint.api._open_signature(WithRetries)
    assert signature.parameters["read_retries"].kind is signature.parameters["timeout"].kind
    assert WithRetries.build(read_retries=3).as_flags() == ["--read-retries=3"]


def test_a_field_without_its_spelling_is_refused():
    @dataclass(frozen=True)
    class Unspelled(OpenOptions):
        read_retries: int | None = None

    with pytest.raises(TypeError, match="read_retries"):
        spelled_fields(Unspelled)
    with pytest.raises(TypeError, match="read_retries"):
        open_flags(cls=Unspelled)
    with pytest.raises(TypeError, match="no open option"):
        open_flags(omit={"read_retry": "a typo"})
    assert [f.name for f in dataclasses.fields(OpenOptions)] == [f.name for f, _ in spelled_fields()]
