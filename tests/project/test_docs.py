"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken link, a page
missing from the navigation, a bad anchor or a reference that cannot be generated fails the build. The
generated references are complete: every option of every ``ckptfs`` command has help text and appears in
its command's section of the CLI reference, and every name ``ckptfs`` exports is in the API reference.

The build needs the ``docs`` extra (scripts/setup.sh installs it); the site goes to a temporary folder.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from conftest import REPO, skip_or_fail


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built strictly into a temporary folder (the build's output is the failure message)."""
    for module in ("mkdocs", "material", "mkdocs_click", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            skip_or_fail(f"{module} is not installed (the docs extra: pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    return out


def page_text(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def sections(page_html: str) -> dict[str, str]:
    """Heading text -> the page's text up to the next heading (tags stripped, entities decoded)."""
    parts = re.split(r"<h[1-6][^>]*>", page_html)
    out = {}
    for part in parts[1:]:
        title, _, body = part.partition("</h")
        title = html.unescape(re.sub(r"<[^>]+>", "", title)).replace("¶", "").strip()
        out[title] = html.unescape(re.sub(r"<[^>]+>", "", body))
    return out


def commands(group: click.Group, path: str = "ckptfs"):
    """(``ckptfs cache prune``, command) for every command and sub-command, groups included."""
    yield path, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, f"{path} {name}")
        else:
            yield f"{path} {name}", command


def options(command: click.Command):
    return [p for p in command.params if isinstance(p, click.Option) and "--help" not in p.opts]


def cli_commands():
    from ckptfs.commands.cli import main
    return list(commands(main))


def test_site_builds_strictly(site):
    assert (site / "index.html").is_file()
    assert (site / "reference" / "cli" / "index.html").is_file()
    assert (site / "reference" / "api" / "index.html").is_file()


def test_every_cli_option_has_help():
    missing = [f"{path} {'/'.join(opt.opts)}" for path, command in cli_commands() for opt in options(command)
               if not (opt.help or "").strip()]
    assert not missing, "options without help text: " + ", ".join(missing)


def test_every_cli_command_and_option_is_in_the_reference(site):
    found = sections(page_text(site, "reference/cli"))
    absent = []
    for path, command in cli_commands():
        body = found.get(path)
        if body is None:
            absent.append(path)
            continue
        absent += [f"{path} {opt}" for param in options(command) for opt in param.opts + param.secondary_opts
                   if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", body)]
    assert not absent, "missing from the CLI reference: " + ", ".join(absent)


def test_every_mount_option_has_its_fstab_spelling(site):
    from ckptfs.commands.cli import mount

    text = sections(page_text(site, "reference/cli"))["mount options in /etc/fstab"]
    for param in options(mount):
        long_opts = [opt for opt in param.opts if opt.startswith("--")]
        if long_opts:
            assert long_opts[0][2:].replace("-", "_") in text, long_opts[0]


def test_every_public_name_is_in_the_api_reference(site):
    import ckptfs

    page = page_text(site, "reference/api")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    missing = [name for name in ckptfs.__all__
               if f'id="ckptfs.{name}"' not in page and f"ckptfs.{name}" not in text]
    assert not missing, "missing from the API reference: " + ", ".join(missing)


def code_text() -> str:
    """The package's source with adjacent string literals joined ("a " f"b" -> "a b"), as messages print."""
    texts = [path.read_text(encoding="utf-8") for path in sorted((REPO / "ckptfs").rglob("*.py"))]
    return re.sub(r"\"\s*\n?\s*f?\"", "", "\n".join(texts))


def literal_parts(message: str) -> list[str]:
    """The fixed words of a documented message: the runs between its placeholders (capitals such as MNT,
    SRC, N, quoted 'X', '...')."""
    parts = [part.strip(" ():;,") for part in re.split(r"\b[A-Z][A-Z_]*\b(?!_)|'[^']*'|\.\.\.|\$\w+", message)]
    return [part for part in parts if len(part) >= 12]


def test_troubleshooting_quotes_the_code_s_own_messages():
    page = (REPO / "docs" / "guide" / "troubleshooting.md").read_text(encoding="utf-8")
    messages = [m for line in page.splitlines() if line.startswith("- `")
                for m in re.findall(r"`([^`]+)`", line.split(" — ")[0])]
    assert len(messages) >= 20, messages
    source = code_text()
    absent = [f"{message!r}: {part!r}" for message in messages for part in literal_parts(message)
              if part not in source]
    assert not absent, "documented messages the code no longer says:\n" + "\n".join(absent)


def test_every_meta_json_field_is_in_the_layout_reference(small):
    """Each key of a GGUF tensor's NAME.meta.json (what ``Tensor.meta`` returns) is described on the page."""
    import ckptfs

    page = (REPO / "docs" / "reference" / "layout.md").read_text(encoding="utf-8")
    with ckptfs.open(small.path) as ck:
        keys = set(ck["q"].meta)
    assert {"name", "storage_type", "shape", "damaged"} <= keys
    missing = sorted(key for key in keys if f"`{key}`" not in page)
    assert not missing, "meta.json fields missing from docs/reference/layout.md: " + ", ".join(missing)


def test_every_file_the_docs_name_exists():
    """Paths of the repository named in the README and docs/ (``ckptfs/service/mount.py``, ``scripts/x.py``, and
    module paths relative to the package such as ``fuse/kernel.py``) name files that exist."""
    texts = [(REPO / "README.md").read_text(encoding="utf-8")]
    texts += [p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").rglob("*.md"))]
    text = "\n".join(texts)
    named = set(re.findall(r"\b((?:ckptfs|scripts|tests)/[\w./-]+\.(?:py|c|sh|json))\b", text))
    packages = "|".join(p.name for p in (REPO / "ckptfs").iterdir() if p.is_dir() and p.name != "__pycache__")
    named |= {f"ckptfs/{m}" for m in re.findall(rf"`((?:{packages})/[\w./-]+\.(?:py|c))`", text)}
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, "named in the docs but not in the repository: " + ", ".join(missing)


def test_the_metrics_reference_names_exactly_the_metrics_the_code_defines():
    """docs/reference/metrics.md against ckptfs/service/metrics.py (counters gain ``_total`` when exported)."""
    code = set(re.findall(r"\"(ckptfs_[a-z_]+)\"", (REPO / "ckptfs" / "service" / "metrics.py").read_text()))
    page = (REPO / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    documented = {name.removesuffix("_total") for name in re.findall(r"`(ckptfs_[a-z_]+)`", page)}
    assert len(code) >= 10, code
    assert documented == code, (f"documented only: {sorted(documented - code)}; "
                                f"defined only: {sorted(code - documented)}")


def test_every_environment_variable_the_code_reads_is_in_the_reference():
    """Each ``CKPTFS_*`` name in the package's source is described on docs/reference/environment.md."""
    names = set(re.findall(r"\bCKPTFS_[A-Z0-9_]*[A-Z0-9]\b", code_text()))
    page = (REPO / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    assert names, "no CKPTFS_ variable found in the code"
    missing = sorted(name for name in names if name not in page)
    assert not missing, "environment variables missing from docs/reference/environment.md: " + ", ".join(missing)


def test_the_architecture_s_layer_map_names_modules_that_exist():
    """Every ``module.py`` the layer map of docs/architecture.md lists under a package is in that package."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = page.split("## Layers", 1)[1].split("```", 2)[1]
    package, missing, seen = None, [], 0
    for line in block.splitlines():
        head = re.match(r"^ ([a-z]+)/\s", line)
        if head:
            package = head.group(1)
        if package is None or not (REPO / "ckptfs" / package).is_dir():
            continue
        for module in re.findall(r"\b(\w+\.(?:py|c))\b", line):
            seen += 1
            if not any((REPO / "ckptfs" / package).rglob(module)):
                missing.append(f"{package}/{module}")
    assert seen >= 30, seen
    assert not missing, "docs/architecture.md names modules that do not exist: " + ", ".join(missing)


def test_every_module_is_on_the_architecture_map():
    """The module map of docs/architecture.md names every module of the package (each ``.py`` but
    ``__init__.py``, and each C extension's ``.c``) by its path in ``ckptfs/``, and nothing else."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    root = REPO / "ckptfs"
    modules = {path.relative_to(root).as_posix() for suffix in ("*.py", "*.c") for path in root.rglob(suffix)
               if path.name != "__init__.py"}
    packages = "|".join(p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__")
    named = set(re.findall(rf"`((?:{packages})/[\w/]+\.(?:py|c))`", section))
    assert len(modules) >= 150, len(modules)
    assert not modules - named, ("modules missing from the module map of docs/architecture.md: "
                                 + ", ".join(sorted(modules - named)))
    assert not named - modules, ("the module map of docs/architecture.md names modules that do not exist: "
                                 + ", ".join(sorted(named - modules)))


#: Headings of a lab notebook: test inventories and measurements. Tests document themselves; every measured
#: figure lives on docs/performance.md, with its command, once.
LAB_HEADING = re.compile(r"^#{1,6}\s+(?:the\s+)?(?:figures|tests?|how it is tested|measured|measurements?|benchmarks?)\b",
                         re.IGNORECASE)


def doc_pages() -> list[Path]:
    return sorted((REPO / "docs").rglob("*.md"))


def headings(text: str) -> list[str]:
    """The Markdown headings of ``text``, code blocks left out (a ``# comment`` in a shell example is none)."""
    found, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and re.match(r"^#{1,6}\s", line):
            found.append(line)
    return found


def test_each_topic_has_one_page():
    """No two pages share a file name (``docs/caches.md`` beside ``docs/guide/caches.md``): a topic's tasks
    and its behaviour are one page, so that no fact is written twice."""
    by_name: dict[str, list[str]] = {}
    for page in doc_pages():
        by_name.setdefault(page.name, []).append(page.relative_to(REPO / "docs").as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert len(by_name) >= 20, sorted(by_name)
    assert not shared, f"pages that share a topic: {shared}"


@pytest.mark.parametrize(("line", "lab"), [
    ("## Figures", True), ("## Tests", True), ("### The tests", True), ("## How it is tested", True),
    ("## Measured (2026-11-29, a 2-core VM)", True), ("## Benchmark (CPU)", True),
    ("# Installation and tests", False), ("## Set-up and tests", False), ("## The figures", True),
    ("## Performance", False), ("## Testing a mount by hand", False)])
def test_lab_headings_are_recognised(line, lab):
    assert bool(LAB_HEADING.match(line)) is lab, line


def test_no_page_but_performance_has_a_figures_or_tests_heading():
    assert headings("## A\n```\n# Tests\n```\n### B") == ["## A", "### B"]
    offending = [f"{page.relative_to(REPO).as_posix()}: {line}" for page in doc_pages()
                 if page.name != "performance.md"
                 for line in headings(page.read_text(encoding="utf-8")) if LAB_HEADING.match(line)]
    assert not offending, "test inventories or measurements outside docs/performance.md:\n" + "\n".join(offending)
