"""Files: inputs read safely, results and measurements written whole or not at all.

Reading (every file a user names: the scenario, ``model.hf_config``, ``plan.deepspeed_config``,
an Accelerate config) opens only regular files, at most :data:`MAX_INPUT_BYTES`, and decodes
them as UTF-8; anything else (a directory, a FIFO, ``/dev/zero``, a symlink loop, a NUL in the
path, binary bytes) is one :class:`~simdist.errors.ScenarioError` naming the field. Parsing
(YAML, JSON) is :mod:`simdist.io.text`, bounded the same way.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.io.text import parse_json, parse_yaml

MAX_INPUT_BYTES = 4 * 2**20  # scenarios and configs are a few KB; the largest HF config.json ~100 KB

_OPEN_ERRORS = {
    errno.ENOENT: "does not exist",
    errno.ENOTDIR: "does not exist (a part of the path is not a directory)",
    errno.EACCES: "cannot be read (permission denied)",
    errno.ELOOP: "is a symbolic link loop",
    errno.EISDIR: "is a directory, not a file",
    errno.ENAMETOOLONG: "is too long a path",
}


def read_text(path: str | Path, field: str, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file at ``path``; problems are reported under ``field``."""
    shown = _show(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below)
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except ValueError:  # NUL byte in the path
        raise ScenarioError(Problem(field, f"{shown}: a path cannot contain a NUL character")) from None
    except OSError as exc:
        why = _OPEN_ERRORS.get(exc.errno or 0, f"cannot be opened ({exc.strerror})")
        raise ScenarioError(Problem(field, f"{shown} {why}")) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ScenarioError(Problem(field, f"{shown} is {_kind(info.st_mode)}, not a regular file"))
        if info.st_size > limit:
            raise ScenarioError(Problem(field, f"{shown} is {info.st_size:,} bytes; the limit is {limit:,}"))
        data = _read_at_most(fd, limit + 1)
    except OSError as exc:
        raise ScenarioError(Problem(field, f"{shown} cannot be read ({exc.strerror})")) from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while being read
        raise ScenarioError(Problem(field, f"{shown} is larger than the limit of {limit:,} bytes"))
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not content
    except UnicodeDecodeError as exc:
        raise ScenarioError(Problem(field, f"{shown} is not UTF-8 text (byte 0x{data[exc.start]:02x} "
                                    f"at offset {exc.start})")) from None


def read_yaml(path: str | Path, field: str = "file") -> Any:
    """The data of the YAML file at ``path`` (see :func:`simdist.io.text.parse_yaml`)."""
    return parse_yaml(read_text(path, field), _show(path), field)


def read_json_object(path: str | Path, field: str) -> dict[str, Any]:
    """The JSON object in the file at ``path``; any other JSON value is refused."""
    data = parse_json(read_text(path, field), _show(path), field)
    if not isinstance(data, dict):
        raise ScenarioError(Problem(field, f"{_show(path)} must hold a JSON object, not {_json_kind(data)}"))
    return data


def _read_at_most(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _json_kind(data: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(data), "a number")


def _show(path: str | Path) -> str:
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else repr(path)
    text = str(text).replace("\x00", "\\0")
    return text if len(text) <= 200 else text[:197] + "..."


# --- writing ------------------------------------------------------------------------------


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temporary file in the same folder, then rename it over ``path``."""
    write_text_atomic(path, json.dumps(data, indent=2, default=str))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Whole or not at all: a temporary file in the same folder renamed over ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    import tempfile  # here: a prediction that writes nothing does not import it

    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
