"""Common machinery of the class-structured batch samplers.

Every sampler here plans an epoch as a list of *batch specs* -- for each batch, the pools its parts
are drawn from -- and fills each part with :func:`~.class_pools.fill_part`. This base class owns
everything else: label parsing, the private generator, epochs, sharding and ``__len__``.

Randomness: a private CPU ``torch.Generator`` seeded from ``(seed, epoch)``; the global RNGs are
never touched, and every draw names ``device="cpu"``, so the batches do not depend on torch's
default device (``torch.set_default_device("cuda")``). ``set_epoch(e)`` selects the epoch of the
next iteration; every iteration then advances the epoch by one, so a PML trainer (which just
re-iterates the DataLoader) gets a fresh but reproducible shuffle each epoch, and DDP users calling
``set_epoch`` get the usual semantics.
The epoch is claimed when the iteration yields its first batch, not when ``iter()`` is called:
a ``DataLoader`` with ``num_workers > 0`` calls ``iter()`` twice per epoch, and an epoch's
batches must depend only on ``(seed, epoch)`` whatever the loader does. ``state_dict()`` /
``load_state_dict()`` hold ``(seed, epoch)`` for exact resume.

Sharding: the epoch's batches are padded with extra batches (drawn from randomly chosen specs of the
same epoch, with fresh classes) to a multiple of ``num_replicas``; rank ``r`` yields batches
``r, r + R, r + 2R, ...``. Ranks get disjoint batches and the same count, ``ceil(B / R)``.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler

from ..data.labels import UNLABELED, as_two_level
from ..functional.validation import check_int
from .class_pools import ClassPools, PoolCursor, fill_part


def refuse_pml_keywords(sampler: str, m, length_before_new_iter) -> None:
    """Raise ``TypeError`` for PML ``MPerClassSampler`` arguments that have no equal here.

    PML's signature is ``MPerClassSampler(labels, m, batch_size=None, length_before_new_iter=...)``
    and its users write ``MPerClassSampler(labels, 4)``. Our samplers take ``batch_size`` by
    keyword only and keep the second place for ``m`` so that the same call is refused, naming the
    fix, instead of silently meaning ``batch_size=4``. The samplers take whole classes (no exact
    per-class count) and their epoch length follows from the scheme.

    Args:
        sampler: the class name, for the message.
        m, length_before_new_iter: the arguments as passed (``None``: not passed).

    Raises:
        TypeError: either is not ``None``, naming it and what to use.
    """
    if m is not None:
        m = int(m) if isinstance(m, numbers.Integral) else repr(m)  # numpy ints shown as 4
        raise TypeError(
            f"{sampler}(labels, {m}) / {sampler}(labels, m={m}): the second argument is PML "
            f"MPerClassSampler's m (exactly m items per class), and {sampler} has no m: it fills "
            f"batches with whole classes. Pass batch_size={m} by keyword for {m} items per "
            f"batch, or samples_per_class={m} to cap the items a class contributes to a batch "
            "(the nearest equivalent of m); or keep PML's MPerClassSampler"
        )
    if length_before_new_iter is not None:
        raise TypeError(
            f"{sampler} has no length_before_new_iter (PML MPerClassSampler's number of samples "
            "per iteration): its epoch length follows from the scheme (see len(sampler), "
            "docs/samplers.md); train for more batches with more epochs"
        )


class ClassBatchSampler(BatchSampler):
    """Base for samplers that build batches of exactly ``batch_size`` indices from whole classes.

    Subclasses set up their pools in ``__init__`` and implement ``_epoch_specs``, returning one
    spec per batch: a tuple of ``(pool_key, part_size)`` pairs whose sizes add up to ``batch_size``.

    Everything after ``labels`` is keyword-only; the second place holds PML's ``m``, refused
    (:func:`refuse_pml_keywords`), so ``Sampler(labels, 4)`` is a ``TypeError`` naming
    ``batch_size=4`` rather than a batch of 4.

    What is never sampled is warned about and recorded: ``excluded`` lists ``(what, key, why)``
    per excluded pool (``("category", 3, "has 4 usable items ...")``) and
    ``("class", n, why)`` for the ``n`` single-item classes; ``candidates`` counts the pools
    considered per kind (``{"category": 8}``). ``pml-rank check`` reports both.
    """

    def __init__(
        self,
        labels,
        m=None,
        *,
        batch_size: int | None = None,
        categories=None,
        samples_per_class="all",
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        length_before_new_iter=None,
    ):
        refuse_pml_keywords(type(self).__name__, m, length_before_new_iter)
        if batch_size is None:  # a default only so that a positional m is refused first
            raise TypeError(f"{type(self).__name__} needs batch_size= (items per batch)")
        batch_size = check_int(batch_size, "batch_size", minimum=2)
        num_replicas = check_int(num_replicas, "num_replicas", minimum=1)
        rank = check_int(rank, "rank", minimum=0, maximum=num_replicas - 1)
        seed = check_int(seed, "seed", minimum=0)
        self.labels = as_two_level(labels, categories)
        super().__init__(range(len(self.labels)), batch_size, drop_last=False)
        self.pools = ClassPools(self.labels, samples_per_class)
        # what is never sampled, for `pml-rank check`'s summary: (what, key, why) per pool
        # excluded, ("class", n, why) for the single-item classes; `candidates`: pools considered
        self.excluded: list[tuple[str, Any, str]] = []
        self.candidates: dict[str, int] = {}
        if self.pools.num_singletons:
            why = "have a single item and are never sampled (a query needs a positive)"
            self.excluded.append(("class", self.pools.num_singletons, why))
            warnings.warn(f"{self.pools.num_singletons} class(es) {why}", stacklevel=3)
        self.samples_per_class = samples_per_class
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._pool_members: dict = {}

    # -- subclass interface -------------------------------------------------------------------
    def _epoch_specs(self, generator: torch.Generator) -> list[tuple]:
        raise NotImplementedError

    def _num_epoch_batches(self) -> int:
        raise NotImplementedError

    # -- pools ------------------------------------------------------------------------------------
    def _add_pool(self, key, members: np.ndarray) -> None:
        self._pool_members[key] = members

    def _part_size(self, parts: int, indivisible: str, part_name: str) -> int:
        """``batch_size / parts``, the items of each part of a batch.

        Args:
            parts: how many equal parts a batch is split into.
            indivisible: the ``ValueError`` message when ``batch_size`` is not divisible by
                ``parts``.
            part_name: what a part is called in the ``ValueError`` when it would hold < 2 items.
        """
        if self.batch_size % parts:
            raise ValueError(indivisible)
        size = self.batch_size // parts
        if size < 2:
            raise ValueError(f"{part_name} must hold >= 2 items, got {size}")
        return size

    def _add_category_pools(self, size: int) -> dict:
        """Add a pool per labeled category (not -1) that can fill ``size`` items and set
        ``self.categories`` to their sorted ids; the others are excluded with a warning naming
        them. Returns the added pools by category id."""
        categories = sorted(set(self.pools.class_category.tolist()) - {UNLABELED})
        candidates = {int(c): self.pools.pool(c) for c in categories}
        usable = self._usable_pools(candidates, size, "category")
        for key, members in usable.items():
            self._add_pool(key, members)
        self.categories = sorted(usable)
        return usable

    def _usable_pools(self, candidates: dict, size: int, what: str) -> dict:
        """Keep the candidate pools that can fill ``size`` items; warn naming each excluded one."""
        usable = {}
        self.candidates[what] = self.candidates.get(what, 0) + len(candidates)
        for key, members in candidates.items():
            problem = self.pools.pool_problem(members, size)
            if problem is None:
                usable[key] = members
            else:
                self.excluded.append((what, key, problem))
                warnings.warn(f"{what} {key!r} excluded: it {problem}", stacklevel=3)
        return usable

    # -- epochs, sharding, iteration ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` (an integer >= 0) for the next iteration (later iterations continue from
        it)."""
        self.epoch = check_int(epoch, "epoch", minimum=0)

    @staticmethod
    def _shuffled(specs: list[tuple], generator: torch.Generator) -> list[tuple]:
        """``specs`` in an order drawn from ``generator``."""
        order = torch.randperm(len(specs), generator=generator, device="cpu").tolist()
        return [specs[i] for i in order]

    def _generator(self, epoch: int) -> torch.Generator:
        state = np.random.SeedSequence([self.seed, epoch]).generate_state(2, dtype=np.uint32)
        # on the CPU whatever torch's default device (torch.set_default_device("cuda") in a GPU
        # script): every draw below names device="cpu", so the batches are the same everywhere
        generator = torch.Generator(device="cpu")
        return generator.manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` for this rank (does not change the sampler's epoch)."""
        generator = self._generator(epoch)
        specs = self._epoch_specs(generator)
        cursors = {
            key: PoolCursor(members, generator) for key, members in self._pool_members.items()
        }

        def fill(spec) -> list[int]:
            parts = [fill_part(self.pools, cursors[key], size, generator) for key, size in spec]
            return np.concatenate(parts).tolist()

        batches = [fill(spec) for spec in specs]
        padding = -len(specs) % self.num_replicas
        if padding:
            picks = torch.randint(len(specs), (padding,), generator=generator, device="cpu")
            picks = picks.tolist()
            batches += [fill(specs[i]) for i in picks]
        # Every rank builds the whole epoch from the same generator, then keeps its own slice, so
        # the shards are exactly the single-process epoch (plus padding) split R ways.
        return batches[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        # A generator function: its body runs at the first batch requested, not at iter(). A
        # DataLoader with num_workers > 0 calls iter() twice per epoch and consumes only the
        # second iterator, so claiming the epoch here keeps batches a function of (seed, epoch).
        epoch = self.epoch
        self.epoch = epoch + 1
        yield from self.epoch_batches(epoch)

    def state_dict(self) -> dict:
        """``{"seed", "epoch"}``: everything the next iteration's batches depend on."""
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`: the next iteration yields the saved epoch's batches."""
        if not isinstance(state, dict) or sorted(state) != ["epoch", "seed"]:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"sampler state_dict has keys {keys}, expected ['epoch', 'seed']")
        seed = check_int(state["seed"], "seed", minimum=0)
        if seed != self.seed:
            raise ValueError(
                f"sampler state_dict has seed {seed}, but this sampler's seed is {self.seed}: "
                "build the sampler with the seed of the run being resumed"
            )
        self.epoch = check_int(state["epoch"], "epoch", minimum=0)

    def __len__(self) -> int:
        return -(-self._num_epoch_batches() // self.num_replicas)
