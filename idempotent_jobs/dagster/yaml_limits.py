"""Limits on the YAML a project hands the package (a component's ``defs.yaml``, a subjects file),
checked before anything parses it into objects: a file over :data:`MAX_YAML_BYTES`, or with
more than :data:`MAX_YAML_ALIASES` aliases (an alias bomb expands a few lines into billions of
nodes, and a loader hangs building them), is refused naming the file and the reason. Reading
its events costs as much as the text: aliases are counted, never expanded."""

from pathlib import Path

import yaml

from idempotent_jobs.core.errors import InvalidInputError

#: The largest YAML file taken (a component's attributes, a subjects list).
MAX_YAML_BYTES = 1_000_000
#: The most aliases (``*name``) a YAML file may hold.
MAX_YAML_ALIASES = 100


def check_yaml_text(text: str, where: str) -> None:
    """Refuse ``text`` (from ``where``) over the limits; a YAML syntax error is left to the
    loader, which says where it is."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise InvalidInputError(where, f"is {size:,} bytes, over the {MAX_YAML_BYTES:,} taken")
    aliases = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    raise InvalidInputError(
                        where,
                        f"has more than {MAX_YAML_ALIASES} aliases (*name): refused, as an "
                        "alias bomb would be; write the values out",
                    )
    except yaml.YAMLError:
        return


def check_yaml_file(path: Path) -> None:
    """:func:`check_yaml_text` on a file, refused by size before it is read."""
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise InvalidInputError(str(path), f"is {size:,} bytes, over the {MAX_YAML_BYTES:,} taken")
    check_yaml_text(path.read_text(encoding="utf-8", errors="surrogateescape"), str(path))
