"""MkDocs hook: the configuration reference's tables of options, generated at build time from
the one settings definition (`retryfs.config.PARAMETERS`), so that the page cannot drift."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- retryfs:options -->"


def options_table() -> str:
    """Every ``retry_*`` URL parameter with its environment variable, default and meaning; the
    per-group ones (``retry_<group>_<field>``) in a table of their own."""
    from retryfs.config import PARAMETERS
    from retryfs.policy import GROUPS

    grouped = {group: [p for name, p in PARAMETERS.items() if name.startswith(f"{group}_")
                       and p.default.startswith("`retry_")] for group in GROUPS}
    in_groups = {p.name for group in grouped.values() for p in group}
    rows = ["| URL parameter | environment variable | default | example | meaning |",
            "| --- | --- | --- | --- | --- |"]
    for parameter in PARAMETERS.values():
        if parameter.name in in_groups:
            continue
        text = parameter.help.replace("|", "\\|")
        rows.append(f"| `{parameter.url_name}` | `{parameter.env_name}` | {parameter.default} "
                    f"| `{parameter.example}` | {text} |")
    rows += ["", "Per-group parameters (each defaults to its base parameter; the groups are "
             "those of `per_operation`):", "",
             "| group | URL parameters | environment variables |", "| --- | --- | --- |"]
    for group, parameters in grouped.items():
        names = ", ".join(f"`{p.url_name}`" for p in parameters)
        rows.append(f"| {group} | {names} | `RETRYFS_{group.upper()}_<FIELD>` |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, options_table()) if MARKER in markdown else markdown
