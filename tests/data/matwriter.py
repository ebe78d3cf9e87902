"""MAT-file fixtures written with :func:`scipy.io.savemat` (level 5, as MATLAB's ``save -v7``).

``Struct`` and ``Cell`` mark lists that become a 1 x N struct array and a 1 x N cell array; any
other value is passed to ``savemat`` as it is (str -> char, numbers/arrays -> numeric).
"""

from __future__ import annotations

import numpy as np
import scipy.io


class Struct(list):
    """A 1 x N struct array: a list of dicts with the same keys."""


class Cell(list):
    """A 1 x N cell array."""


def _to_savemat(value):
    if isinstance(value, Struct):
        fields = list(value[0]) if value else []
        # savemat writes a structured array with object fields as a struct array
        array = np.empty((1, len(value)), dtype=[(field, object) for field in fields])
        for i, record in enumerate(value):
            for field in fields:
                array[0, i][field] = _to_savemat(record[field])
        return array
    if isinstance(value, Cell):
        array = np.empty((1, len(value)), dtype=object)
        for i, item in enumerate(value):
            array[0, i] = _to_savemat(item)
        return array
    return value


def write_mat(path, variables: dict, compress: bool = False) -> None:
    """Write ``variables`` (``{name: value}``) to the MAT-file ``path``, zlib-compressed if asked."""
    scipy.io.savemat(
        path,
        {name: _to_savemat(value) for name, value in variables.items()},
        do_compression=compress,
        oned_as="row",
    )
