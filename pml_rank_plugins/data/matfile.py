"""Read MATLAB MAT-files with :func:`scipy.io.loadmat`; every failure names the file.

Enough for dataset annotation files such as Cars196's ``cars_annos.mat``. Level-5 files
(``save -v6`` / ``-v7``, compressed or not) and level-4 files are read; v7.3 (HDF5) files raise
:class:`MatFileError`. Values come back in plain Python/numpy form, MATLAB shapes kept:
numeric/logical -> numpy array of the MATLAB shape; char -> ``str`` (rows joined by ``"\\n"``;
an empty char -> ``""``); cell -> numpy object array of the cell shape; struct -> numpy object
array of the struct shape holding ``dict`` field -> value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.io


class MatFileError(ValueError):
    """The file is not a readable MAT-file; the message names the file."""


def load_mat(path: str | Path) -> dict[str, object]:
    """Read every variable of a MAT-file.

    Args:
        path: the ``.mat`` file.

    Returns:
        ``{name: value}`` for every variable (see the module docstring for the value types);
        scipy's ``__header__``/``__version__``/``__globals__`` entries are left out.

    Raises:
        MatFileError: the file is missing, a v7.3 (HDF5) file, not a MAT-file, or damaged
            (truncated, corrupt); the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise MatFileError(f"{path}: MAT-file not found")
    try:
        with open(path, "rb") as handle:
            raw = scipy.io.loadmat(handle, chars_as_strings=True, squeeze_me=False)
    except NotImplementedError as err:  # what loadmat says of a v7.3 file
        raise MatFileError(
            f"{path}: MATLAB v7.3 (HDF5) files are not supported; save it with -v7"
        ) from err
    except Exception as err:
        # loadmat has no one error for a bad file: flipping every bit and cutting at every byte
        # of a small file gave MatReadError, ValueError, TypeError, OSError, IndexError,
        # zlib.error, MemoryError and UnboundLocalError. Each means "not a readable MAT-file".
        raise MatFileError(
            f"{path}: not a level-5 MAT-file, or damaged ({type(err).__name__}: {err}); "
            "download it again or re-save it with MATLAB's save -v7"
        ) from err
    return {name: _plain(value) for name, value in raw.items() if not name.startswith("__")}


def _plain(value: object) -> object:
    """scipy's value -> the plain form of the module docstring (struct records as dicts)."""
    if not isinstance(value, np.ndarray):
        return value
    if value.dtype.names:  # a struct array: a structured array with one object per field
        out = np.empty(value.shape, dtype=object)
        for index in np.ndindex(value.shape):
            out[index] = {field: _plain(value[index][field]) for field in value.dtype.names}
        return out
    if value.dtype == object:  # a cell array
        out = np.empty(value.shape, dtype=object)
        for index in np.ndindex(value.shape):
            out[index] = _plain(value[index])
        return out
    if value.dtype.kind == "U":  # a char array: one string per row (chars_as_strings)
        return "\n".join(str(row) for row in value.reshape(-1))
    return value
