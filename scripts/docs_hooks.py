"""MkDocs hooks (mkdocs.yml ``hooks:``): reference tables generated from the code at build time, so that
they cannot drift from it. A marker comment in a page becomes its table:
- ``<!-- ckptfs:storage-types -->``: every registered codec (ckptfs.quant), its block geometry and dtype;
- ``<!-- ckptfs:gguf-view-architectures -->``: the architectures gguf/model.gguf serves (ckptfs.ggufview);

``<!-- ckptfs:fstab-options -->`` in a page becomes the table of ``ckptfs mount``'s options and their
``-o key=value`` spelling for mount(8) and /etc/fstab, by the rule the mount helper applies
(ckptfs/commands/fstab.py: the long option, dashes as underscores; a flag is the key alone), taken from the
click command itself so that an option added to ``ckptfs mount`` appears without editing the page.
"""

from __future__ import annotations

MARKER = "<!-- ckptfs:fstab-options -->"
TYPES_MARKER = "<!-- ckptfs:storage-types -->"
ARCHS_MARKER = "<!-- ckptfs:gguf-view-architectures -->"


def fstab_table() -> str:
    """One row per long option of ``ckptfs mount``: the option, its fstab spelling, its help text."""
    import click

    from ckptfs.commands.cli import mount

    rows = ["| option | fstab / `mount -o` | what it does |", "|---|---|---|"]
    for param in mount.params:
        if not isinstance(param, click.Option):
            continue
        long_opts = [opt for opt in param.opts if opt.startswith("--")]
        if not long_opts or long_opts[0] == "--help":
            continue
        key = long_opts[0][2:].replace("-", "_")
        if param.is_flag:
            spelling = key
        elif isinstance(param.type, click.Choice):
            spelling = f"{key}={'|'.join(map(str, param.type.choices))}"
        else:
            spelling = f"{key}={param.metavar or param.type.name.upper()}"
        help_text = " ".join((param.help or "").split()).replace("|", "\\|")
        rows.append(f"| `{', '.join(param.opts)}` | `{spelling}` | {help_text} |")
    return "\n".join(rows)


def storage_types_table() -> str:
    """One row per registered codec: block geometry, the dtype ``auto`` serves, C kernel, big-endian."""
    from ckptfs.quant import codec_for, known_types, output_dtype

    rows = ["| storage type | elements per block | bytes per block | `.npy` dtype (`auto`) | served as stored "
            "| C kernel | big-endian files |", "|---|---:|---:|---|---|---|---|"]
    for name in known_types():
        codec = codec_for(name)
        native = _has_native(codec)
        rows.append(f"| `{name}` | {codec.block_elements} | {codec.block_bytes} | `{output_dtype(codec).str}` "
                    f"| {'yes' if codec.exact else ''} | {'yes' if native else ''} "
                    f"| {'decoded' if codec.swap is not None else 'raw only'} |")
    return "\n".join(rows)


def _has_native(codec) -> bool:
    """Whether the C kernel of ``codec`` is built here (the build machine's answer)."""
    try:
        codec.decoder("native")
    except ValueError:
        return False
    return True


def gguf_view_architectures_table() -> str:
    """One row per architecture gguf/model.gguf serves: config names, llama.cpp's architecture."""
    from ckptfs.ggufview.archs import ARCHITECTURES

    rows = ["| architecture | config.json `architectures` | llama.cpp architecture |", "|---|---|---|"]
    for arch in ARCHITECTURES:
        names = ", ".join(f"`{name}`" for name in arch.hf_names)
        rows.append(f"| {arch.name} | {names} | `{arch.model_arch}` |")
    return "\n".join(rows)


GENERATED = {MARKER: fstab_table, TYPES_MARKER: storage_types_table, ARCHS_MARKER: gguf_view_architectures_table}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
