import warnings

import torch

from pml_rank_plugins.functional.eager_cache import eager_lru_cache


def test_eager_calls_are_cached_and_traced_calls_build_in_the_graph():
    builds = []

    @eager_lru_cache(maxsize=4)
    def table(n: int) -> torch.Tensor:
        builds.append(n)
        return torch.arange(n, dtype=torch.float32)

    first, second = table(3), table(3)
    assert first is second and builds == [3]  # eager: one build, then the cached tensor
    assert table.cache_info().hits == 1

    def fn(x):
        return x * table(3).sum()

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Dynamo's "lru_cache ... silent incorrectness" warning
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        x = torch.ones(2)
        assert torch.equal(compiled(x), fn(x))
    torch._dynamo.reset()
    assert builds == [3, 3]  # the trace called the builder itself, uncached
    assert table.cache_info().hits == 2  # fn(x) in eager: from the cache
