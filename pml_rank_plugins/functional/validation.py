"""Input checks and dtype policy shared by every loss kernel."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .chunk_threads import one_thread_apply


def check_finite(tensor: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming ``name``, the count and the first bad element if ``tensor``
    holds NaN or inf, e.g. ``embeddings contains 2 non-finite value(s) (NaN or inf), the first
    embeddings[3, 7] = nan``. O(numel)."""
    if not torch.isfinite(tensor).all():
        bad = ~torch.isfinite(tensor)
        count = bad.sum().item()
        # Only once something is bad: the position costs a nonzero (a sync) on top.
        first = torch.nonzero(bad)[0].tolist() if tensor.ndim else []
        where = f"{name}[{', '.join(map(str, first))}]" if first else name
        raise ValueError(
            f"{name} contains {count} non-finite value(s) (NaN or inf), the first "
            f"{where} = {tensor[tuple(first)].item()}"
        )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel computes in: float16/bfloat16 are promoted to float32, others kept."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype


def check_embedding_shape(tensor: torch.Tensor, name: str, width: int | None = None) -> None:
    """Raise ``ValueError`` unless ``tensor`` is a 2-D ``(N, D)`` floating tensor (``D == width``
    when given): a 1-D vector or a 3-D stack would otherwise be ranked as something else."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor, got {type(tensor).__name__}")
    wanted = "2-D (N, D)" if width is None else f"2-D (N, D) with D = {width} columns"
    if tensor.ndim != 2 or (width is not None and tensor.shape[1] != width):
        raise ValueError(f"{name} must be {wanted}, got shape {tuple(tensor.shape)}")
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")


def check_labels(labels: torch.Tensor, name: str = "labels") -> None:
    """Raise ``TypeError`` for labels that are not a tensor (a Python list or a numpy array
    failed deep inside PML with ``AttributeError: 'list' object has no attribute 'shape'``) and
    ``ValueError`` for bool labels: a mask passed where class ids belong (PML treats labels as
    class ids; two "classes" True/False is almost never what was meant), and ``ValueError`` for
    a 0-D (scalar) tensor, which failed with ``IndexError: tuple index out of range`` (a shape
    check: no device sync). ``None`` passes."""
    if labels is not None and not isinstance(labels, torch.Tensor):
        if _holds_non_numbers(labels):  # torch.as_tensor would raise on them: name the encoder
            raise TypeError(
                f"{name} must be a torch.Tensor of integer class ids, got a "
                f"{type(labels).__name__} of {_first_type(labels)} labels; {ENCODE_HINT}"
            )
        raise TypeError(
            f"{name} must be a torch.Tensor of class ids, got {type(labels).__name__}; "
            f"pass torch.as_tensor({name})"
        )
    if isinstance(labels, torch.Tensor) and labels.ndim == 0:
        raise ValueError(
            f"{name} must have shape (N,), one class id per embedding; got a 0-D (scalar) tensor"
        )
    if isinstance(labels, torch.Tensor) and labels.dtype == torch.bool:
        raise ValueError(
            f"{name} has dtype torch.bool; labels are class ids: pass an integer tensor "
            f"(e.g. {name}.long() if True/False really are the two classes)"
        )


# The dotted path only: functional/ sits below data/ in the layout and may not import it.
ENCODE_HINT = (
    "encode them with codes, names = pml_rank_plugins.data.encode_labels(labels) and pass "
    "codes (ids 0..C-1 in sorted order of the labels; names[id] is the label)"
)


def _flat_first(labels):
    """The first element of a (possibly nested) list/tuple/array, or ``None`` when empty."""
    while isinstance(labels, (list, tuple, np.ndarray)):
        if len(labels) == 0:
            return None
        labels = labels[0]
    return labels


def _holds_non_numbers(labels) -> bool:
    """Whether ``labels`` (a list, tuple or array) holds strings or other non-numbers."""
    if isinstance(labels, np.ndarray) and labels.dtype.kind in "biuf":
        return False
    first = _flat_first(labels)
    numbers = (int, float, np.number, torch.Tensor)  # as_tensor takes these (bool is an int)
    return first is not None and not isinstance(first, numbers)


def _first_type(labels) -> str:
    return type(_flat_first(labels)).__name__


def check_label_values(labels: torch.Tensor | None, name: str = "labels") -> None:
    """Raise ``ValueError`` naming ``name`` for floating-point labels that are not class ids:
    NaN, inf, or a fraction (``1.5``). Integer-valued floats (``3.0``) pass, as in PML; integer
    dtypes and ``None`` pass without reading anything. O(N) for float labels, and it reads the
    result back to the host (a device sync): call it where value checks are on
    (``backend.checks_values``)."""
    if not isinstance(labels, torch.Tensor) or not labels.is_floating_point():
        return
    finite = torch.isfinite(labels)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise ValueError(f"{name} contains {bad} NaN/inf value(s); labels are class ids (integers)")
    fractional = labels != torch.round(labels)
    if bool(fractional.any()):
        example = labels[fractional][0].item()
        raise ValueError(
            f"{name} contains {int(fractional.sum())} non-integer value(s) (e.g. {example}); "
            "labels are class ids: pass integers"
        )


def check_ref_labels_pairing(ref_emb, ref_labels) -> None:
    """``ValueError`` for ``ref_labels`` without ``ref_emb`` (PML would silently use the batch's
    own labels instead)."""
    if ref_emb is None and ref_labels is not None:
        raise ValueError(
            "ref_labels were given without ref_emb: pass the reference embeddings as ref_emb, or "
            "drop ref_labels (the batch is ranked against itself with its own labels)"
        )


NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's default, which PML's distances use


def normalize_rows(x: torch.Tensor, eps: float = NORMALIZE_EPS) -> torch.Tensor:
    """L2-normalize the rows of ``x`` like ``F.normalize(x, dim=1, eps=eps)`` (PML's
    convention), without its two failure modes. O(N D).

    * Overflow: a row whose norm exceeds the dtype's range (float32: about 1.8e19) makes
      ``F.normalize`` return a zero vector. Here such rows are first scaled by an exact power of
      two (``2^-e`` with ``e`` the exponent of the row's max-abs), which changes neither the
      direction nor the mathematical gradient of the normalized row; other rows are untouched, so
      ordinary inputs give bit-identical values and gradients.
    * Rows with ``||x|| < eps`` (zero rows): the value is ``F.normalize``'s ``x / eps`` (zero for
      a zero row), but such a row is treated as a constant and gets a zero gradient. The gradient
      of ``x / eps`` is ``1 / eps = 1e12`` times the upstream gradient: it overflows float16 to
      +-inf and in any dtype hurls the model's weights away because of one degenerate row.
    """
    with torch.no_grad():
        max_abs = x.abs().amax(dim=1, keepdim=True) if x.shape[1] else x.new_zeros(len(x), 1)
        # Squares of entries below this bound cannot overflow in a sum over D columns.
        bound = (torch.finfo(x.dtype).max / (4 * max(x.shape[1], 1))) ** 0.5
        exponent = torch.frexp(max_abs).exponent
        scale = torch.where(max_abs > bound, torch.ldexp(torch.ones_like(max_abs), -exponent), 1)
    scaled = x * scale if bool((scale != 1).any()) else x
    norm = torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
    unit = scaled / norm.clamp_min(eps)
    tiny = (norm < eps) & (scale == 1)
    if bool(tiny.any()):
        unit = torch.where(tiny, x.detach() / eps, unit)
    return unit


def checked_embeddings(
    embeddings: torch.Tensor,
    ref_emb: torch.Tensor,
    finite_check: Callable[[torch.Tensor, str], None] | None,
    same_device: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(queries, refs, is_self)``: queries and references checked and cast to the compute dtype
    (float16/bfloat16 -> float32); ``is_self`` is whether ``ref_emb`` *is* ``embeddings`` (then
    ``refs is queries``). The one body of every backend's input preparation, which differ only in
    the arguments:

    * shapes always (:func:`check_embedding_shape`: 2-D, floating, the same width);
    * ``finite_check(tensor, name)`` on each distinct tensor, e.g. :func:`check_finite` (the
      ``cpu`` path), the screened one of ``screened_inputs``, or ``None`` (the ``gpu`` / ``triton``
      paths without ``check_values``: no value is read);
    * ``same_device``: ``ValueError`` when ``ref_emb`` is on another device than ``embeddings``.

    O(N D) (the finiteness check and the cast)."""
    is_self = ref_emb is embeddings
    check_embedding_shape(embeddings, "embeddings")
    if not is_self:
        check_embedding_shape(ref_emb, "ref_emb", width=embeddings.shape[1])
        if same_device and ref_emb.device != embeddings.device:
            raise ValueError(
                f"ref_emb is on {ref_emb.device}, embeddings on {embeddings.device}: move both to "
                "one device"
            )
    if finite_check is not None:
        finite_check(embeddings, "embeddings")
        if not is_self:
            finite_check(ref_emb, "ref_emb")
    dtype = compute_dtype(embeddings.dtype)
    queries = embeddings.to(dtype)
    return queries, queries if is_self else ref_emb.to(dtype), is_self


def prepare_embeddings(
    embeddings: torch.Tensor, ref_emb: torch.Tensor, normalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Check queries and references (2-D, same width, no NaN/inf) and cast both to the compute
    dtype.

    Returns ``(queries, refs, is_self)``; ``is_self`` is whether ``ref_emb`` *is* ``embeddings``
    (the batch ranked against itself, as PML passes it), in which case ``refs is queries``.
    float16/bfloat16 are cast to float32 *before* anything else, so normalization never runs in
    half precision. ``normalize=True`` also L2-normalizes the rows with ``normalize_rows``
    (no overflow for huge rows; zero rows stay zero with zero gradient).
    """
    queries, refs, is_self = checked_embeddings(embeddings, ref_emb, check_finite)
    if normalize:
        # On one torch thread, backward too (see chunk_threads.one_torch_thread).
        queries = one_thread_apply(normalize_rows, queries)
        refs = queries if is_self else one_thread_apply(normalize_rows, refs)
    return queries, refs, is_self


def check_int(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """Validate a count/size parameter and return it as a Python ``int``.

    Accepts Python and numpy integers; rejects ``bool`` (an ``int`` subclass, almost always a
    mistake here), floats (even integral ones such as ``2.0``: silently truncating ``1.7`` to
    ``1`` is what this guards against), strings and everything else, with a ``ValueError`` naming
    the parameter and the value. ``minimum`` / ``maximum`` are inclusive bounds.
    """
    if minimum is not None and maximum is not None:
        wanted = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        wanted = f"an integer >= {minimum}"
    elif maximum is not None:
        wanted = f"an integer <= {maximum}"
    else:
        wanted = "an integer"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {wanted}, got {value}")
    return value


_PAIR_NAMES = ("positive anchors", "positives", "negative anchors", "negatives")
_TRIPLET_NAMES = ("anchors", "positives", "negatives")


def validate_indices_tuple(
    indices_tuple, num_queries: int, num_refs: int, check_values: bool = True
) -> None:
    """Check a PML ``indices_tuple`` against ``num_queries`` query and ``num_refs`` reference rows.

    ``None`` passes. Otherwise it must be a tuple of 1-D integer tensors: pairs ``(a1, p, a2, n)``
    with ``len(a1) == len(p)`` and ``len(a2) == len(n)``, or triplets ``(a, p, n)`` of one
    length. Anchors index the queries (``embeddings``), the others the reference rows
    (``ref_emb``, the batch itself by default). Raises ``ValueError`` naming the element, e.g.
    ``indices_tuple[3] (negatives) has index 40 >= 32 reference rows``; without this check a
    negative index silently wraps around and a too-large one fails deep inside indexing.
    O(total number of indices). ``check_values=False`` (the ``gpu`` / ``triton`` backends' default)
    skips the range check, the only one that reads index values back to the host.
    """
    if indices_tuple is None:
        return
    if not isinstance(indices_tuple, (tuple, list)):
        raise ValueError(
            "indices_tuple must be a tuple of index tensors, (a1, p, a2, n) or (a, p, n), got "
            f"{type(indices_tuple).__name__}"
        )
    if len(indices_tuple) not in (3, 4):
        raise ValueError(
            "indices_tuple must have 3 (triplets) or 4 (pairs) elements, "
            f"got {len(indices_tuple)}"
        )
    names = _PAIR_NAMES if len(indices_tuple) == 4 else _TRIPLET_NAMES
    anchors = (0, 2) if len(indices_tuple) == 4 else (0,)
    for k, (idx, what) in enumerate(zip(indices_tuple, names)):
        label = f"indices_tuple[{k}] ({what})"
        if not isinstance(idx, torch.Tensor):
            raise ValueError(f"{label} must be a torch tensor of indices, got {type(idx).__name__}")
        if idx.dtype == torch.bool or idx.dtype.is_floating_point or idx.dtype.is_complex:
            raise ValueError(f"{label} must hold integer indices, got dtype {idx.dtype}")
        if idx.ndim != 1:
            raise ValueError(f"{label} must be 1-D, got shape {tuple(idx.shape)}")
        # check_values first: under torch.compile a miner's tuple has a data-dependent length,
        # which dynamo cannot compare with 0 (the value checks are off there anyway).
        if not check_values or len(idx) == 0:
            continue
        limit, rows = (num_queries, "query") if k in anchors else (num_refs, "reference")
        low, high = int(idx.min()), int(idx.max())
        if low < 0:
            raise ValueError(f"{label} has negative index {low} (indices must be in [0, {limit}))")
        if high >= limit:
            raise ValueError(f"{label} has index {high} >= {limit} {rows} rows")
    groups = ((0, 1), (2, 3)) if len(indices_tuple) == 4 else ((0, 1, 2),)
    for group in groups:
        lengths = [len(indices_tuple[k]) for k in group]
        # Compared pairwise, not through a set: equal data-dependent lengths (one symbol under
        # torch.compile) are provably equal, but a set would need their values.
        if any(length != lengths[0] for length in lengths[1:]):
            listed = ", ".join(f"indices_tuple[{k}] has {n}" for k, n in zip(group, lengths))
            raise ValueError(f"mismatched lengths: {listed} (they must be equal)")


def clamp_indices_tuple(
    indices_tuple, num_queries: int, num_refs: int
) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor | None]:
    """``(safe, out_of_range)``: an ``indices_tuple`` whose entries cannot index outside the rows,
    for the backends that do not read index values back (``gpu`` / ``triton`` without
    ``check_values``), and a 0-dim bool device tensor, True when an entry was out of range.

    The structure is checked first (:func:`validate_indices_tuple` without values: the same
    ``ValueError`` naming the element). Each anchor tensor is clamped into ``[0, num_queries)``,
    each other one into ``[0, num_refs)``: an out-of-range index would otherwise reach an
    indexing kernel (``IndexError`` on the CPU, a device-side assert on CUDA, which poisons the
    process's CUDA context) and a negative one would silently wrap around. The caller makes the
    loss NaN where ``out_of_range`` (:func:`flag_non_finite`), so the bad batch is not silently
    trained on; ``check_values=True`` names the element. No host sync (``clamp``, ``any``),
    traceable by ``torch.compile``; O(total number of indices). ``(None, None)`` for ``None``.
    """
    if indices_tuple is None:
        return None, None
    validate_indices_tuple(indices_tuple, num_queries, num_refs, check_values=False)
    anchors = (0, 2) if len(indices_tuple) == 4 else (0,)
    safe, flags = [], []
    for k, idx in enumerate(indices_tuple):
        limit = num_queries if k in anchors else num_refs
        # With no row at all every entry is out of range; clamped to 0, never used (the losses
        # return before indexing an empty batch or reference set).
        clamped = idx.clamp(0, max(limit - 1, 0))
        safe.append(clamped)
        # An entry moved by the clamp was out of range (or there are no rows): 3 operators.
        flags.append((clamped != idx).any() if limit else torch.ones_like(idx).bool().any())
    return tuple(safe), torch.stack(flags).any()


def clamp_self_index(
    self_index: torch.Tensor, labels: torch.Tensor, ref_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(safe, bad)``: an int64 ``(N,)`` ``self_index`` clamped into ``[0, M)`` and a 0-dim bool
    device tensor, True when an entry was outside ``[0, M)`` or names a column whose label is
    not the query's (what ``check_self_index`` refuses with ``check_values=True``). Same role
    and cost model as :func:`clamp_indices_tuple`: no host sync, O(N)."""
    m = len(ref_labels)
    safe = self_index.clamp(0, max(m - 1, 0))
    bad = (safe != self_index).any() if m else torch.ones_like(self_index).bool().any()
    if m and len(self_index):
        bad = bad | (ref_labels.to(labels.device)[safe].to(labels.dtype) != labels).any()
    return safe, bad


def flag_non_finite(loss, bad: torch.Tensor | None):
    """``loss`` where ``bad`` is False, NaN (with a zero gradient) where it is True; ``loss`` as is
    for ``bad=None``. A device-side ``where``: the host learns of it when it reads the loss, as
    it learns of a NaN embedding, and ``check_values=True`` (or
    :func:`pml_rank_plugins.losses.diagnose_non_finite`) names the cause."""
    if bad is None or not isinstance(loss, torch.Tensor):
        return loss
    return torch.where(bad.to(loss.device), torch.full_like(loss, float("nan")), loss)
