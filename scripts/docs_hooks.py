"""MkDocs hooks (mkdocs.yml ``hooks:``): reference tables generated from the code at build time.

``<!-- ckptfs:fstab-options -->`` in a page becomes the table of ``ckptfs mount``'s options and their
``-o key=value`` spelling for mount(8) and /etc/fstab, by the rule the mount helper applies
(ckptfs/commands/fstab.py: the long option, dashes as underscores; a flag is the key alone), taken from the
click command itself so that an option added to ``ckptfs mount`` appears without editing the page.
"""

from __future__ import annotations

MARKER = "<!-- ckptfs:fstab-options -->"


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, fstab_table())
    return markdown
