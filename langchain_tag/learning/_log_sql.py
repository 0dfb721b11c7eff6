"""The verdict log's SQL, one text for SQLite and PostgreSQL, and its rows' records.

`{t}` is the verdicts table, `{i}` the inputs table, `{s}` the skip records' table
(checked identifiers), `{id}`, `{bool}`, `{real}` the dialect's types, `?` a
parameter (PostgreSQL's store turns it into `%s`); `verdict_log` fills them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_tag.learning._records import SkipRecord, VerdictRecord
from langchain_tag.learning.learned_prefilter import HashedFeatures

# The verdicts table's columns after `id`, each named as its `VerdictRecord` field,
# with its type: the one list the statements below are built from.
VERDICT_COLUMNS = (
    ("input_digest", "TEXT NOT NULL"),
    ("rule_id", "TEXT NOT NULL"),
    ("rule_hash", "TEXT NOT NULL"),
    ("applies", "{bool} NOT NULL"),
    ("score", "{real}"),
    ("error", "TEXT"),
    ("model", "TEXT"),
    ("prompt_version", "TEXT"),
    ("profile", "TEXT"),
    ("source", "TEXT NOT NULL"),
    ("explore", "{real}"),
    ("created", "{real} NOT NULL"),
    # Added later: logs made before get these at open (`ADDED_COLUMNS`), last, so
    # old and new tables have one layout.
    ("reason", "TEXT"),
)
ADDED_COLUMNS = VERDICT_COLUMNS[-1:]
"""Columns a log made by an older version may lack: nullable, added when opened."""
COLUMN_NAMES = tuple(name for name, _ in VERDICT_COLUMNS)

# The skip records' table (`{s}`), beside the verdicts: its columns after `id`,
# each named as its `SkipRecord` field.
SKIP_COLUMNS = (
    ("input_digest", "TEXT NOT NULL"),
    ("rule_id", "TEXT NOT NULL"),
    ("rule_hash", "TEXT NOT NULL"),
    ("skipped_yes", "{real} NOT NULL"),
    ("explore", "{real} NOT NULL"),
    ("created", "{real} NOT NULL"),
)
SKIP_NAMES = tuple(name for name, _ in SKIP_COLUMNS)

SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS {i} (digest TEXT PRIMARY KEY, text TEXT, "
        "features TEXT, last_used {real} NOT NULL)"
    ),
    "CREATE TABLE IF NOT EXISTS {t} (id {id}, "
    + ", ".join(f"{name} {kind}" for name, kind in VERDICT_COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS {t}_created ON {t} (created)",
    "CREATE INDEX IF NOT EXISTS {t}_input ON {t} (input_digest)",
    "CREATE TABLE IF NOT EXISTS {s} (id {id}, "
    + ", ".join(f"{name} {kind}" for name, kind in SKIP_COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS {s}_created ON {s} (created)",
    "CREATE INDEX IF NOT EXISTS {s}_input ON {s} (input_digest)",
)
ADD_COLUMN = "ALTER TABLE {t} ADD COLUMN "
# The newest use keeps an input from being pruned as an orphan while its verdict is
# written (see DELETE_ORPHANS).
UPSERT_INPUT = (
    "INSERT INTO {i} (digest, text, features, last_used) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (digest) DO UPDATE SET last_used = excluded.last_used, "
    "text = COALESCE({i}.text, excluded.text), "
    "features = COALESCE({i}.features, excluded.features)"
)
# Built from constant column names only (S608).
INSERT_VERDICT = (
    f"INSERT INTO {{t}} ({', '.join(COLUMN_NAMES)}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(COLUMN_NAMES))})"
)
INSERT_SKIP = (
    f"INSERT INTO {{s}} ({', '.join(SKIP_NAMES)}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(SKIP_NAMES))})"
)
SKIP_PAGE = (
    f"SELECT k.id, {', '.join(f'k.{name}' for name in SKIP_NAMES)}, "  # noqa: S608
    "i.text, i.features FROM {s} k LEFT JOIN {i} i ON i.digest = k.input_digest "
    "WHERE k.id > ? ORDER BY k.id LIMIT ?"
)
NO_SKIPS = (
    "(SELECT id, "  # noqa: S608 - constant column names
    + ", ".join(
        name
        if name in {"input_digest", "rule_id", "rule_hash", "created"}
        else f"0.0 AS {name}"
        for name in SKIP_NAMES
    )
    + " FROM {t} WHERE 1 = 0)"
)
"""Stands for the skip table in a log read only that has none: no rows, the
same columns (a subquery, so every use of `{s}` in a read names an alias)."""


def page_query(absent: frozenset[str] = frozenset()) -> str:
    """The query of a page of records; NULL for the `absent` (added) columns."""
    columns = (
        f"NULL AS {name}" if name in absent else f"v.{name}" for name in COLUMN_NAMES
    )
    return (
        f"SELECT v.id, {', '.join(columns)}, i.text, i.features "  # noqa: S608
        "FROM {t} v LEFT JOIN {i} i ON i.digest = v.input_digest "
        "WHERE v.id > ? ORDER BY v.id LIMIT ?"
    )


PAGE_QUERY = page_query()
INPUT_COLUMNS = ("digest", "text", "features", "last_used")
DELETE_OLDER = "DELETE FROM {t} WHERE created < ?"
DELETE_BEYOND = (
    "DELETE FROM {t} WHERE id <= (SELECT id FROM {t} ORDER BY id DESC LIMIT 1 OFFSET ?)"
)
DELETE_ORPHANS = (
    "DELETE FROM {i} WHERE last_used <= ? AND NOT EXISTS "
    "(SELECT 1 FROM {t} WHERE {t}.input_digest = {i}.digest) AND NOT EXISTS "
    "(SELECT 1 FROM {s} WHERE {s}.input_digest = {i}.digest)"
)
DELETE_OLDER_SKIPS = "DELETE FROM {s} WHERE created < ?"
# Skip records as old as the verdicts kept: the stream the log still holds.
DELETE_SKIPS_BEFORE_VERDICTS = (
    "DELETE FROM {s} WHERE created < (SELECT MIN(created) FROM {t})"
)
TOTALS = (
    "SELECT COUNT(*), COUNT(DISTINCT input_digest), COUNT(DISTINCT rule_id), "
    "COALESCE(SUM(CASE WHEN applies THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN error IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN explore IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "MIN(created), MAX(created), COALESCE(MAX(id), 0) FROM {t}"
)
STORED = (
    "SELECT COALESCE(SUM(CASE WHEN text IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN features IS NOT NULL THEN 1 ELSE 0 END), 0) FROM {i}"
)
BY_SOURCE = "SELECT source, COUNT(*) FROM {t} GROUP BY source ORDER BY source"
BY_MODEL = (
    "SELECT COALESCE(model, ''), COUNT(*) FROM {t} "
    "GROUP BY COALESCE(model, '') ORDER BY COALESCE(model, '')"
)
PER_RULE = (
    "SELECT rule_id, COUNT(*), SUM(CASE WHEN applies THEN 1 ELSE 0 END) FROM {t} "
    "GROUP BY rule_id ORDER BY rule_id"
)
COUNT = "SELECT COUNT(*) FROM {t}"
SKIP_COUNT = "SELECT COUNT(*) FROM {s} k"
POSITION = "SELECT COALESCE(MAX(id), 0) FROM {t}"
CLEAR = ("DELETE FROM {t}", "DELETE FROM {s}", "DELETE FROM {i}")

# `stream_counts`: `{sources}` is the filter on the verdicts' source, `{latest}`
# the last verdict of each pair (`LATEST`).
LATEST = (
    "SELECT v.input_digest, v.applies, v.explore FROM {t} v JOIN (SELECT "
    "MAX(id) AS id FROM {t} WHERE error IS NULL{sources} GROUP BY input_digest, "
    "rule_id) last ON last.id = v.id"
)
STREAM_YES = (
    "SELECT COALESCE(SUM(CASE WHEN l.applies AND l.explore IS NULL AND "
    "k.input_digest IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN l.applies AND l.explore IS NOT NULL THEN 1 ELSE 0 "
    "END), 0), "
    "COALESCE(SUM(CASE WHEN l.applies AND k.input_digest IS NULL THEN 1 ELSE 0 "
    "END), 0) "
    "FROM ({latest}) l LEFT JOIN (SELECT DISTINCT input_digest FROM {s} k) k "
    "ON k.input_digest = l.input_digest"
)
STREAM_SKIPS = (
    "SELECT COUNT(DISTINCT input_digest), COALESCE(SUM(skipped_yes), 0), "
    "COALESCE(SUM(skipped_yes * explore), 0) FROM {s} k"
)
STREAM_INPUTS = (
    "SELECT COUNT(*) FROM (SELECT input_digest FROM {t} WHERE error IS NULL"
    "{sources} UNION SELECT input_digest FROM {s} k) u"
)
STREAM_RECENT = "SELECT COUNT(*), COUNT(DISTINCT input_digest) FROM {t} WHERE id > ?"

Statement = tuple[str, Sequence[Sequence[Any]]]
"""A statement template and the parameter rows to run it with."""


def skip_record(row: Sequence[Any]) -> SkipRecord:
    """The skip record of a `SKIP_PAGE` row: id, the columns, text, features."""
    id_, *columns, text, features = row
    return SkipRecord(
        **dict(zip(SKIP_NAMES, columns, strict=True)),
        id=id_,
        text=text,
        features=None
        if features is None
        else HashedFeatures.model_validate_json(features),
    )


def verdict_record(row: Sequence[Any]) -> VerdictRecord:
    """The record of a `PAGE_QUERY` row: id, the columns, text, features."""
    id_, *columns, text, features = row
    fields: dict[str, Any] = dict(zip(COLUMN_NAMES, columns, strict=True))
    fields["applies"] = bool(fields["applies"])  # SQLite stores an integer
    return VerdictRecord(
        **fields,
        id=id_,
        text=text,
        features=None
        if features is None
        else HashedFeatures.model_validate_json(features),
    )
