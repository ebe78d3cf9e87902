"""A tiny level-5 MAT-file writer for test fixtures, written from the MathWorks format spec
("MAT-File Format", ch. 1): little-endian, doubles/uint8/char/cell/struct, optional zlib."""

from __future__ import annotations

import struct
import zlib

import numpy as np

MI_INT8, MI_UINT8, MI_UINT16, MI_INT32, MI_UINT32, MI_DOUBLE = 1, 2, 4, 5, 6, 9
MI_MATRIX, MI_COMPRESSED = 14, 15
MX_CELL, MX_STRUCT, MX_CHAR, MX_DOUBLE, MX_UINT8 = 1, 2, 4, 6, 9


class Struct(list):
    """A 1 x N struct array: a list of dicts with the same keys."""


class Cell(list):
    """A 1 x N cell array."""


def _element(kind: int, payload: bytes, small_ok: bool = True) -> bytes:
    if small_ok and len(payload) <= 4:
        return struct.pack("<HH", kind, len(payload)) + payload.ljust(4, b"\0")
    pad = (-len(payload)) % 8
    return struct.pack("<II", kind, len(payload)) + payload + b"\0" * pad


def _matrix(value, name: str = "") -> bytes:
    if isinstance(value, Struct):
        fields = list(value[0]) if value else []
        mx, dims = MX_STRUCT, (1, len(value))
        width = max([len(f) for f in fields] + [1]) + 1
        body = _element(MI_INT32, struct.pack("<i", width))
        body += _element(MI_INT8, b"".join(f.encode().ljust(width, b"\0") for f in fields))
        for record in value:
            for field in fields:
                body += _element(MI_MATRIX, _matrix(record[field]), small_ok=False)
    elif isinstance(value, Cell):
        mx, dims = MX_CELL, (1, len(value))
        body = b"".join(_element(MI_MATRIX, _matrix(v), small_ok=False) for v in value)
    elif isinstance(value, str):
        mx, dims = MX_CHAR, (1 if value else 0, len(value))
        body = _element(MI_UINT16, np.array([ord(c) for c in value], "<u2").tobytes())
    else:
        array = np.asarray(value)
        mx = MX_UINT8 if array.dtype == np.uint8 else MX_DOUBLE
        dims = array.shape if array.ndim >= 2 else (1, array.size)
        data = array.astype("<f8" if mx == MX_DOUBLE else "u1").tobytes(order="F")
        # MATLAB stores small integer-valued doubles in a narrower type, as cars_annos.mat does
        if mx == MX_DOUBLE and array.size and np.all(array == np.round(array)) and array.min() >= 0:
            data = array.astype("<u2").tobytes(order="F")
            body = _element(MI_UINT16, data)
        else:
            body = _element(MI_DOUBLE if mx == MX_DOUBLE else MI_UINT8, data)
    head = _element(MI_UINT32, struct.pack("<II", mx, 0))
    head += _element(MI_INT32, struct.pack(f"<{len(dims)}i", *dims))
    head += _element(MI_INT8, name.encode())
    return head + body


def write_mat(path, variables: dict, compress: bool = False) -> None:
    header = b"MATLAB 5.0 MAT-file, written by the pml_rank_plugins test suite".ljust(116)
    out = header + b"\0" * 8 + struct.pack("<H", 0x0100) + b"IM"
    for name, value in variables.items():
        element = _element(MI_MATRIX, _matrix(value, name), small_ok=False)
        if compress:
            packed = zlib.compress(element)
            element = struct.pack("<II", MI_COMPRESSED, len(packed)) + packed
        out += element
    with open(path, "wb") as handle:
        handle.write(out)
