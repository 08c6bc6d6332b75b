"""Files uploaded to the dashboard, which is a server: what an uploaded scenario may read.

An uploaded scenario names its ``model.hf_config`` and ``plan.deepspeed_config`` by file name
only, and only files uploaded with it: they are written to a private folder of the server's
temporary directory (created for them, mode 0700) and the scenario is read against that folder,
never against the repository, an absolute path or ``../``. Uploads are decoded as UTF-8 within
simdist's input limit. Pure functions and file writes, no Streamlit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.spec.files import MAX_INPUT_BYTES
from simdist.units import short_repr

REFERENCES = (("model", "hf_config"), ("plan", "deepspeed_config"))  # the fields that name files
MAX_NAME = 255


def plain_name(name: Any) -> bool:
    """A file name with no folder part: no separator, no NUL, not ``.``/``..``, not hidden."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME and not name.startswith(".")
            and not any(c in name for c in "/\\\x00"))


def upload_bytes(name: str, data: bytes, field: str) -> bytes:
    """The bytes of an upload within the input limit, under a plain name (the browser sends both)."""
    if not plain_name(name):
        raise ScenarioError(Problem(field, f"{short_repr(name, 60)} is not a plain file name"))
    if len(data) > MAX_INPUT_BYTES:
        raise ScenarioError(Problem(field, f"{name} is {len(data):,} bytes; the limit is {MAX_INPUT_BYTES:,}"))
    return data


def upload_text(name: str, data: bytes, field: str = "file") -> str:
    """An upload decoded as UTF-8 (a byte-order mark dropped)."""
    data = upload_bytes(name, data, field)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ScenarioError(Problem(field, f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                                    f"offset {exc.start})")) from None


def reference_problems(raw: Mapping[str, Any], uploaded: Collection[str]) -> list[Problem]:
    """One problem per file reference of ``raw`` that is not the plain name of an uploaded file."""
    out = []
    for section, key in REFERENCES:
        sec = raw.get(section)
        if not isinstance(sec, Mapping) or sec.get(key) is None:
            continue
        ref, field = sec[key], f"{section}.{key}"
        if not plain_name(ref):
            out.append(Problem(field, f"{short_repr(ref, 60)}: an uploaded scenario names a file uploaded "
                               "with it, by its name alone (no folder, no ../)"))
        elif ref not in uploaded:
            out.append(Problem(field, f"{ref} was not uploaded with the scenario: add it under "
                               "\"Files the scenario names\""))
    return out


def private_folder(files: Mapping[str, bytes], parent: Path) -> Path:
    """A new folder under ``parent`` holding ``files`` (plain names), and nothing else."""
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="upload-", dir=parent))
    for name, data in files.items():
        if not plain_name(name):
            raise ValueError(f"not a plain file name: {name!r}")
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    return folder


def forget_others(parent: Path, keep: Path) -> None:
    """Remove the earlier private folders under ``parent`` (a session keeps only its newest)."""
    if not parent.is_dir():
        return
    for child in parent.iterdir():
        if child != keep and child.name.startswith("upload-"):
            remove(child)


def remove(folder: Path) -> None:
    """Remove a private folder (never following a symbolic link out of it)."""
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)


def confined(base_dir: Path, ref: Any) -> Path | None:
    """``base_dir / ref`` if it stays inside ``base_dir`` (after symbolic links), else None."""
    if not isinstance(ref, str) or not ref or "\x00" in ref or os.path.isabs(ref):
        return None
    base = base_dir.resolve()
    path = (base / ref).resolve()
    return path if path.is_relative_to(base) else None


def shown(message: str, base_dir: Path | str | None) -> str:
    """A message with the private folder's path left out (a server path is not the user's business)."""
    if base_dir is None:
        return message
    folder = str(base_dir)
    return message.replace(folder + os.sep, "").replace(folder, "the upload")
