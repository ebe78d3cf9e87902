"""A minimal reader for MATLAB level-5 MAT-files (``save -v6`` / ``-v7``), without scipy.

Enough for dataset annotation files such as Cars196's ``cars_annos.mat``: numeric, logical and char
arrays, cell arrays and struct arrays, compressed (``miCOMPRESSED``) or not, either byte order.
Sparse/object arrays and v7.3 (HDF5) files raise :class:`MatFileError`. Format reference: MathWorks,
"MAT-File Format", version 7, chapter 1 ("Level 5 MAT-File Format").

Values come back as: numeric/logical -> numpy array of the MATLAB shape (column-major data put in
that shape); char -> ``str`` (rows joined by ``"\\n"``; a 0 x 0 char -> ``""``); cell -> numpy
object array of the cell shape; struct -> numpy object array of the struct shape holding ``dict``
field -> value.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

# data types of the element tags
_MI_DTYPES = {
    1: "i1",
    2: "u1",
    3: "i2",
    4: "u2",
    5: "i4",
    6: "u4",
    7: "f4",
    9: "f8",
    12: "i8",
    13: "u8",
}
MI_MATRIX, MI_COMPRESSED, MI_UTF8, MI_UTF16, MI_UTF32 = 14, 15, 16, 17, 18
# array classes (low byte of the array flags)
MX_CELL, MX_STRUCT, MX_OBJECT, MX_CHAR, MX_SPARSE = 1, 2, 3, 4, 5
_MX_NUMERIC = {
    6: "f8",
    7: "f4",
    8: "i1",
    9: "u1",
    10: "i2",
    11: "u2",
    12: "i4",
    13: "u4",
    14: "i8",
    15: "u8",
}
_LOGICAL_FLAG, _COMPLEX_FLAG = 0x0200, 0x0800


class MatFileError(ValueError):
    """The file is not a readable level-5 MAT-file; the message names the file."""


def load_mat(path: str | Path) -> dict[str, object]:
    """Read every variable of a level-5 MAT-file. Returns ``{name: value}`` (see module doc)."""
    path = Path(path)
    if not path.is_file():
        raise MatFileError(f"{path}: MAT-file not found")
    data = path.read_bytes()
    if data[:8] == b"\x89HDF\r\n\x1a\n" or data[512 : 512 + 8] == b"\x89HDF\r\n\x1a\n":
        raise MatFileError(f"{path}: MATLAB v7.3 (HDF5) files are not supported; save with -v7")
    if len(data) < 128:
        raise MatFileError(f"{path}: too short for a MAT-file header ({len(data)} bytes)")
    endian_mark = data[126:128]
    if endian_mark == b"IM":
        order = "<"
    elif endian_mark == b"MI":
        order = ">"
    else:
        raise MatFileError(f"{path}: not a level-5 MAT-file (no IM/MI endian indicator)")
    reader = _Reader(path, order)
    variables: dict[str, object] = {}
    try:
        for name, value in reader.elements(data, 128, top_level=True):
            if name is not None:
                variables[name] = value
    except (struct.error, zlib.error, ValueError, IndexError) as err:
        if isinstance(err, MatFileError):
            raise
        raise MatFileError(f"{path}: corrupt MAT-file ({err})") from err
    return variables


class _Reader:
    def __init__(self, path: Path, order: str):
        self.path = path
        self.order = order

    def error(self, problem: str) -> MatFileError:
        return MatFileError(f"{self.path}: {problem}")

    def tag(self, data: bytes, pos: int) -> tuple[int, int, int, int]:
        """``(type, nbytes, data start, next element)`` of the element at ``pos``."""
        if pos + 8 > len(data):
            raise self.error(f"truncated element tag at byte {pos}")
        first, second = struct.unpack(self.order + "II", data[pos : pos + 8])
        if first >> 16:  # small data element: type and size packed in 4 bytes, data in the next 4
            return first & 0xFFFF, first >> 16, pos + 4, pos + 8
        end = pos + 8 + second
        if end > len(data):
            raise self.error(f"element at byte {pos} runs past the end of the data")
        padded = end if first == MI_COMPRESSED else pos + 8 + ((second + 7) // 8) * 8
        return first, second, pos + 8, padded

    def elements(self, data: bytes, pos: int, top_level: bool = False):
        while pos < len(data):
            if top_level and len(data) - pos < 8:
                break
            kind, nbytes, start, pos = self.tag(data, pos)
            body = data[start : start + nbytes]
            if kind == MI_COMPRESSED:
                yield from self.elements(zlib.decompress(body), 0, top_level)
            elif kind == MI_MATRIX:
                yield self.matrix(body)
            else:
                raise self.error(f"unexpected top-level element type {kind}")

    def numeric(self, data: bytes, pos: int) -> tuple[np.ndarray | str, int]:
        kind, nbytes, start, nxt = self.tag(data, pos)
        raw = data[start : start + nbytes]
        if kind in _MI_DTYPES:
            return np.frombuffer(raw, dtype=np.dtype(self.order + _MI_DTYPES[kind])), nxt
        if kind == MI_UTF8:
            return raw.decode("utf-8"), nxt
        if kind in (MI_UTF16, MI_UTF32):
            codec = ("utf-16" if kind == MI_UTF16 else "utf-32") + (
                "-le" if self.order == "<" else "-be"
            )
            return raw.decode(codec), nxt
        raise self.error(f"unexpected data element type {kind}")

    def matrix(self, body: bytes) -> tuple[str | None, object]:
        """Parse the inside of one miMATRIX element -> ``(name, value)``."""
        if not body:  # an empty miMATRIX stands for an empty array (e.g. an unset struct field)
            return None, np.zeros((0, 0))
        flags, pos = self.numeric(body, 0)
        mx_class, flag_bits = int(flags[0]) & 0xFF, int(flags[0]) & 0xFF00
        dims, pos = self.numeric(body, pos)
        shape = tuple(int(d) for d in dims)
        name_raw, pos = self.numeric(body, pos)
        name = bytes(np.asarray(name_raw, dtype=np.uint8)).decode("ascii") or None
        count = int(np.prod(shape)) if shape else 0
        if mx_class in _MX_NUMERIC:
            real, pos = self.numeric(body, pos)
            values = np.asarray(real).astype(_MX_NUMERIC[mx_class])
            if flag_bits & _COMPLEX_FLAG:
                imag, pos = self.numeric(body, pos)
                values = values + 1j * np.asarray(imag).astype(np.float64)
            if flag_bits & _LOGICAL_FLAG:
                values = values.astype(bool)
            return name, self.shaped(values, shape)
        if mx_class == MX_CHAR:
            chars, pos = self.numeric(body, pos)
            if isinstance(chars, str):
                codes = np.array([ord(c) for c in chars], dtype=np.int64)
            else:
                codes = np.asarray(chars).astype(np.int64)
            if count == 0:
                return name, ""
            grid = self.shaped(codes, shape).reshape(shape[0], -1)
            return name, "\n".join("".join(chr(c) for c in row) for row in grid)
        if mx_class == MX_CELL:
            items = []
            for _ in range(count):
                kind, nbytes, start, pos = self.tag(body, pos)
                if kind != MI_MATRIX:
                    raise self.error(f"cell element of type {kind}, expected miMATRIX")
                items.append(self.matrix(body[start : start + nbytes])[1])
            return name, self.shaped_objects(items, shape)
        if mx_class == MX_STRUCT:
            length, pos = self.numeric(body, pos)
            width = int(np.asarray(length)[0])
            names_raw, pos = self.numeric(body, pos)
            names_bytes = bytes(np.asarray(names_raw, dtype=np.uint8))
            fields = [
                names_bytes[i : i + width].split(b"\0", 1)[0].decode("ascii")
                for i in range(0, len(names_bytes), width)
            ]
            records = []
            for _ in range(count):
                record = {}
                for field in fields:
                    kind, nbytes, start, pos = self.tag(body, pos)
                    if kind != MI_MATRIX:
                        raise self.error(f"struct field {field!r} of type {kind}")
                    record[field] = self.matrix(body[start : start + nbytes])[1]
                records.append(record)
            return name, self.shaped_objects(records, shape)
        raise self.error(f"array class {mx_class} (sparse/object) is not supported")

    @staticmethod
    def shaped(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray(values).reshape(shape, order="F")

    @staticmethod
    def shaped_objects(items: list, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(len(items), dtype=object)
        for i, item in enumerate(items):
            out[i] = item
        return out.reshape(shape, order="F")
