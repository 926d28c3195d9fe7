"""MkDocs hook: the configuration reference's tables of options, generated at build time from
the one settings definition (`retryfs.config.PARAMETERS`), so that the page cannot drift."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- retryfs:options -->"

#: The Python type a parameter takes as a keyword, by the name of the parser that reads it.
TYPES = {
    "_int": "`int`", "_float": "`float`", "<lambda>": "`float`", "_bool": "`bool`",
    "_seconds_or_none": "`float` or `None`", "_throughput": "`float` (bytes/s)",
    "_size": "`int` (bytes; `\"32MiB\"`)", "_client_attempts": "`int` or `None`",
    "_backend": "`str`", "_one_part_client": "`str`", "_file_client": "`str`",
    "_messages": "`Sequence[str]`",
    "_rate_limit": "`RateLimit`, `str` or `bool`", "_budget": "`RetryBudget` or `bool`",
    "_timeout": "`float`, `Mapping[str, float]` or `None`",
}


def _type(parameter: Any) -> str:
    return TYPES.get(getattr(parameter.parse, "__name__", ""), "")


def options_table() -> str:
    """Every ``retry_*`` URL parameter with its environment variable, default and meaning; the
    per-group ones (``retry_<group>_<field>``) in a table of their own."""
    from retryfs.config import PARAMETERS
    from retryfs.core.policy import GROUPS

    grouped = {group: [p for name, p in PARAMETERS.items() if name.startswith(f"{group}_")
                       and p.default.startswith("`retry_")] for group in GROUPS}
    in_groups = {p.name for group in grouped.values() for p in group}
    rows = ["| URL parameter | environment variable | type | default | example | meaning |",
            "| --- | --- | --- | --- | --- | --- |"]
    for parameter in PARAMETERS.values():
        if parameter.name in in_groups:
            continue
        text = parameter.help.replace("|", "\\|")
        rows.append(f"| `{parameter.url_name}` | `{parameter.env_name}` | {_type(parameter)} "
                    f"| {parameter.default} | `{parameter.example}` | {text} |")
    rows += ["", "Per-group parameters (each defaults to its base parameter; the groups are "
             "those of `per_operation`):", "",
             "| group | URL parameters | environment variables |", "| --- | --- | --- |"]
    for group, parameters in grouped.items():
        names = ", ".join(f"`{p.url_name}`" for p in parameters)
        rows.append(f"| {group} | {names} | `RETRYFS_{group.upper()}_<FIELD>` |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, options_table()) if MARKER in markdown else markdown
