"""The rows of a local data file, chosen by its suffix: JSON, JSONL, parquet or CSV.

Each reader yields one raw row at a time (a dict, or whatever a JSON line holds, so that the converter
can count a bad row instead of stopping), and turns every unreadable file into one :class:`DataError`
line naming the file and, where there is one, the row. JSONL and parquet stream, so a 1.8M-row file
is never held whole; a ``.json`` file is one document and is read whole.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SUFFIXES = (".json", ".jsonl", ".parquet", ".csv")


class DataError(ValueError):
    """A file cannot be converted at all (missing, unreadable, no usable fields)."""


def read_rows(path: Path) -> Iterator[Any]:
    """Rows of a local .json (a list of objects; one object a line also read), .jsonl, .parquet or .csv file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".json":
        return _read_json(path)
    if path.suffix == ".csv":
        return _read_csv(path)
    raise DataError(f"{path}: unsupported file type {path.suffix!r} (allowed: {', '.join(SUFFIXES)})")


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({error})") from None
    return (row for batch in table.iter_batches(batch_size=4096) for row in batch.to_pylist())


def _read_jsonl(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8-sig") as handle:
        number = 0
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    yield None  # a blank line is a row with nothing in it: counted, not dropped silently
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}: row {number} is not valid JSON ({error.msg})") from None
        except UnicodeDecodeError:
            raise DataError(f"{path}: row {number + 1} is not UTF-8 text") from None


def _read_json(path: Path) -> Iterator[Any]:
    """A JSON document holding a list of rows (a single object is one row); a file of one object a line
    (JSONL named .json, as the hub's exports often are) is read as JSONL."""
    text = _text(path)
    if text.lstrip().startswith("["):
        try:
            return iter(json.loads(text))
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: not valid JSON at line {error.lineno} ({error.msg})") from None
    try:
        return iter([json.loads(text)])
    except json.JSONDecodeError:
        return _read_jsonl(path)


def _read_csv(path: Path) -> Iterator[dict[str, Any]]:
    """Rows keyed by the header line; every value is text (an empty cell is a missing value)."""
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            for row in reader:
                yield {key: (None if value == "" else value) for key, value in row.items() if key is not None}
        except csv.Error as error:
            raise DataError(f"{path}: row {reader.line_num} is not valid CSV ({error})") from None
        except UnicodeDecodeError:
            raise DataError(f"{path}: row {reader.line_num + 1} is not UTF-8 text") from None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None


def fields_of(rows: Iterator[Any], seen: set[str]) -> Iterator[Any]:
    """``rows`` unchanged, with the field names of every object row added to ``seen`` (for an error naming
    the fields a file has)."""
    for row in rows:
        if isinstance(row, dict):
            seen.update(str(key) for key in row)
        yield row
