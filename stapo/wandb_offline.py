"""Read the logged history of a wandb run written in offline mode, without network.

``WANDB_MODE=offline`` writes ``wandb/offline-run-<time>-<id>/run-<id>.wandb``: a log of protobuf
``Record`` messages. wandb 0.31 reads it only in its Go ``wandb-core`` binary (``wandb sync``, which
uploads) and its public ``wandb.Api`` needs the server, so this module reads the file itself: the
framing is leveldb's log format (32 KiB blocks of chunks, each ``crc32 | length | type`` then the
payload; a 7-byte ``:W&B`` header first), and each payload is parsed with wandb's own protobuf class
(``wandb.proto.wandb_internal_pb2.Record``). A chunk whose checksum does not match (a run killed
mid-write) ends the reading there, as wandb's reader does.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_IDENT, _MAGIC = b":W&B", 0xBEE1
_CHUNK = struct.Struct("<IHB")  # crc32, length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_files(path: str | Path) -> list[Path]:
    """The ``.wandb`` logs under a run folder (``wandb/offline-run-*``), an offline-run folder, or the file itself."""
    path = Path(path)
    if path.is_file():
        return [path]
    found = sorted(path.glob("run-*.wandb"))
    if not found:
        found = sorted(path.glob("wandb/*run-*/run-*.wandb")) + sorted(path.glob("*run-*/run-*.wandb"))
    return found


def read_records(path: str | Path):
    """Every complete, checksum-valid ``Record`` of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if len(data) < _HEADER.size:
        return
    ident, magic, _ = _HEADER.unpack_from(data)
    if ident != _IDENT or magic != _MAGIC:
        raise ValueError(f"{path}: not a wandb run log (header {data[: _HEADER.size]!r})")
    pos, pending = _HEADER.size, b""
    while pos + _CHUNK.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK.size:  # the block's tail is padding
            pos += left
            continue
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        payload = data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        pos += _CHUNK.size + length
        if kind == 0 and length == 0:  # zero padding at the end of a preallocated block
            continue
        if len(payload) < length or zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            return  # torn or corrupt tail
        pending = payload if kind in (_FULL, _FIRST) else pending + payload
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_history(path: str | Path) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` of every numeric history value, merged over the run's logs.

    The step is the one the logger passed (``wandb.log(..., step=N)``, as verl does); wandb's own
    ``_step``/``_runtime``/``_timestamp`` keys are dropped.
    """
    files = wandb_files(path)
    if not files:
        raise FileNotFoundError(f"{path}: no wandb run log (wandb/offline-run-*/run-*.wandb)")
    steps: dict[int, dict[str, float]] = {}
    for file in files:
        for record in read_records(file):
            if record.WhichOneof("record_type") != "history":
                continue
            items = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if key.startswith("_"):
                    continue
                try:
                    value = json.loads(item.value_json)
                except json.JSONDecodeError:
                    continue
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                items[key] = float(value)
            step = record.history.step.num
            steps.setdefault(int(step), {}).update(items)
    return dict(sorted(steps.items()))
