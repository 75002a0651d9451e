"""The rows of a local data file, chosen by its suffix: JSON, JSONL, parquet or CSV.

Each reader yields one raw row at a time (a dict, or whatever a JSON line holds, so that the converter
can count a bad row instead of stopping), and turns every unreadable file into one :class:`DataError`
line naming the file and, where there is one, the row (and the line, for text). JSONL, CSV and parquet
stream, so a 1.8M-row file is never held whole; a ``.json`` file is one document and is read whole.

Text is decoded one line at a time: a text reader decodes 8 KiB at once, so a bad byte used to surface
at the start of its chunk and be reported rows too early. A CSV cell has no length limit here (the csv
module refuses a cell over 131,072 characters and with it the whole file): a row too long to use is
skipped and counted by the converter, as the same row in JSONL is.
"""

from __future__ import annotations

import codecs
import csv
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SUFFIXES = (".json", ".jsonl", ".parquet", ".csv")
CSV_CELL_LIMIT = min(sys.maxsize, 2**31 - 1)  # the csv module's field_size_limit, raised while we read


class DataError(ValueError):
    """A file cannot be converted at all (missing, unreadable, no usable fields)."""


def read_rows(path: Path) -> Iterator[Any]:
    """Rows of a local .json (a list of objects; one object a line also read), .jsonl, .parquet or .csv file."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder; --input takes one file ({', '.join(SUFFIXES)})")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix!r} (allowed: {', '.join(SUFFIXES)})")
    if is_blank(path):
        raise DataError(f"{path} is empty")
    readers = {".parquet": _read_parquet, ".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv}
    return readers[path.suffix](path)


def is_blank(path: Path) -> bool:
    """True when the file holds nothing but white space (and a byte order mark)."""
    with path.open("rb") as handle:
        first = True
        while chunk := handle.read(1 << 16):
            if first and chunk.startswith(codecs.BOM_UTF8):
                chunk = chunk[len(codecs.BOM_UTF8):]
            first = False
            if chunk.strip():
                return False
    return True


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({error})") from None
    return _parquet_rows(path, table)


def _parquet_rows(path: Path, table) -> Iterator[dict[str, Any]]:
    done = 0
    try:
        for batch in table.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield row
                done += 1
    except DataError:
        raise
    except Exception as error:  # a damaged row group further in
        raise DataError(f"{path}: not a readable parquet file after row {done} ({error})") from None


def _lines(path: Path, where: Callable[[int], str]) -> Iterator[str]:
    """The file's lines, each decoded on its own; a bad byte names ``where(line number)``."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(f"{path}: {where(number)} is not UTF-8 text (byte 0x{raw[error.start]:02x} at "
                                f"column {error.start + 1}); save the file as UTF-8") from None


def _read_jsonl(path: Path) -> Iterator[Any]:
    """One row a line: a row's number is its line's."""
    for number, line in enumerate(_lines(path, lambda line: f"row {line} (line {line})"), start=1):
        if not line.strip():
            yield None  # a blank line is a row with nothing in it: counted, not dropped silently
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: row {number} is not valid JSON ({error.msg})") from None


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


def _read_csv(path: Path) -> Iterator[dict[str, Any] | None]:
    """Rows keyed by the header line; every value is text (an empty cell is a missing value, a blank line a row
    with nothing in it, as in JSONL). Row N is the N-th record after the header, whatever lines its quoted
    cells span."""
    done = 0

    def where(line: int) -> str:
        return f"the header (line {line})" if header is None else f"row {done + 1} (line {line})"

    header: list[str] | None = None
    limit = csv.field_size_limit(CSV_CELL_LIMIT)
    reader = csv.reader(_lines(path, where))
    try:
        header = next(reader, None)
        if header is None:
            return
        for values in reader:
            done += 1
            if not values:
                yield None
                continue
            yield {key: (values[i] if i < len(values) and values[i] != "" else None) for i, key in enumerate(header)}
    except csv.Error as error:
        raise DataError(f"{path}: {where(reader.line_num)} is not valid CSV ({error})") from None
    finally:
        csv.field_size_limit(limit)


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(f"{path}: line {line} is not UTF-8 text (byte 0x{data[error.start]:02x}); save the file as "
                        "UTF-8") from None


def fields_of(rows: Iterator[Any], seen: set[str]) -> Iterator[Any]:
    """``rows`` unchanged, with the field names of every object row added to ``seen`` (for an error naming
    the fields a file has)."""
    for row in rows:
        if isinstance(row, dict):
            seen.update(str(key) for key in row)
        yield row
