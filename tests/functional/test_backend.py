"""The backend selection rule (functional/backend.py) and the device-aware chunk rule
(functional/chunking.py): keyword > context > environment variable > auto; bad names and an
unavailable triton are errors naming their source; the GPU rule comes from a fixed budget."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.functional import backend as backend_module
from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.backend import (
    ENV_VAR,
    requested_backend,
    resolve_backend,
    use_backend,
)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_auto_picks_by_device():
    assert requested_backend() == "auto"
    assert resolve_backend("cpu") == "cpu"
    assert resolve_backend(torch.device("meta")) == "gpu"
    assert resolve_backend("cuda:0") == "gpu"  # dtype not known: the path correct for any dtype


CUDA = torch.device("cuda", 0)  # a device object only: no tensor, so no GPU is needed
FUSED = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", FUSED + [torch.float64])
@pytest.mark.parametrize("has_triton", [True, False])
def test_auto_on_cuda_is_triton_for_the_fused_dtypes_else_gpu(monkeypatch, dtype, has_triton):
    monkeypatch.setattr(backend_module, "triton_available", lambda: has_triton)
    expected = "triton" if has_triton and dtype in FUSED else "gpu"
    assert resolve_backend(CUDA, dtype=dtype) == expected
    assert resolve_backend("cuda", None, dtype=dtype) == expected
    with use_backend("auto"):
        assert resolve_backend(CUDA, dtype=dtype) == expected
    # the CPU and other devices do not depend on the dtype or on triton
    assert resolve_backend("cpu", dtype=dtype) == "cpu"
    assert resolve_backend(torch.device("meta"), dtype=dtype) == "gpu"


@pytest.mark.parametrize("dtype", FUSED + [torch.float64])
def test_an_explicit_backend_is_kept_whatever_the_dtype(monkeypatch, dtype):
    monkeypatch.setattr(backend_module, "triton_available", lambda: True)
    for name in ("cpu", "gpu", "triton"):
        assert resolve_backend(CUDA, name, dtype=dtype) == name
    monkeypatch.setenv(ENV_VAR, "gpu")
    assert resolve_backend(CUDA, dtype=dtype) == "gpu"


def test_an_explicit_triton_with_float64_is_a_clear_error():
    from pml_rank_plugins.losses import FastAPLoss

    emb = torch.randn(8, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64.*use the cpu or gpu backend for float64"):
        FastAPLoss(backend="triton")(emb, torch.arange(8) % 2)


def test_the_losses_pass_the_embeddings_dtype_to_the_rule(monkeypatch):
    # auto on a (pretended) CUDA device: float64 embeddings get gpu, float32 ones triton.
    from pml_rank_plugins.losses import loss_output

    monkeypatch.setattr(backend_module, "triton_available", lambda: True)
    assert loss_output.call_backend(CUDA, None, torch.float64) == "gpu"
    assert loss_output.call_backend(CUDA, None, torch.float32) == "triton"
    assert loss_output.call_backend(CUDA, "gpu", torch.float32) == "gpu"


def test_env_var_context_and_keyword_in_order(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "gpu")
    assert resolve_backend("cpu") == "gpu"
    with use_backend("cpu"):
        assert resolve_backend("cpu") == "cpu"
        with use_backend("gpu"):
            assert resolve_backend("cpu") == "gpu"
            assert resolve_backend("cpu", backend="cpu") == "cpu"
        assert resolve_backend("cpu") == "cpu"
    assert resolve_backend("cpu") == "gpu"
    monkeypatch.setenv(ENV_VAR, " GPU ")
    assert requested_backend() == "gpu"
    monkeypatch.setenv(ENV_VAR, "")
    assert requested_backend() == "auto"


@pytest.mark.parametrize("value", ["cuda", "fast", "1"])
def test_a_bad_env_value_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(ValueError, match=rf"{ENV_VAR} must be one of auto, cpu, gpu, triton"):
        resolve_backend("cpu")


def test_a_bad_keyword_or_context_is_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cpu", backend="GPU ")
    with pytest.raises(ValueError, match="use_backend must be one of"):
        with use_backend(3):
            pass


def test_triton_without_the_package_is_an_error_never_a_fallback(monkeypatch):
    monkeypatch.setattr(backend_module, "triton_available", lambda: False)
    monkeypatch.setenv(ENV_VAR, "triton")
    with pytest.raises(ValueError, match=f"{ENV_VAR}=triton, but the triton package"):
        resolve_backend("cpu")
    with pytest.raises(ValueError, match="backend=triton, but"):
        resolve_backend("cpu", backend="triton")


def test_the_context_is_restored_after_an_exception():
    with pytest.raises(RuntimeError):
        with use_backend("gpu"):
            raise RuntimeError("boom")
    assert requested_backend() == "auto"


def test_cpu_rule_is_unchanged():
    # max(256K / M, 128) rows, at most 4M / M, at most N.
    assert chunking.rows_per_chunk(4096, 4096) == 128
    assert chunking.rows_per_chunk(4096, 1024) == 256
    assert chunking.rows_per_chunk(100, 1024) == 100
    assert chunking.rows_per_chunk(10, 1 << 23) == 1
    assert chunking.rows_per_chunk(4096, 4096, 7) == 7


def test_gpu_rule_comes_from_the_budget(monkeypatch):
    # 2 GiB at 20 bytes a pair: N = 4096 fits in one chunk; N = M = 65536 does not.
    assert chunking.rows_per_chunk(4096, 4096, bytes_per_pair=20) == 4096
    expected = (2 << 30) // (20 * 65536)
    assert chunking.rows_per_chunk(65536, 65536, bytes_per_pair=20) == expected
    # chunk_size still overrides
    assert chunking.rows_per_chunk(65536, 65536, 100, bytes_per_pair=20) == 100
    # the budget is one function to patch
    monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: 1000)
    assert chunking.rows_per_chunk(4096, 10, bytes_per_pair=20) == 5
    assert chunking.rows_per_chunk(4096, 10**6, bytes_per_pair=20) == 1


def test_gpu_budget_on_cuda_is_a_tenth_of_total_memory_capped(monkeypatch):
    class Props:
        total_memory = 8 << 30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props)
    assert chunking.gpu_budget_bytes("cuda:0") == int(0.1 * (8 << 30))
    Props.total_memory = 141 << 30
    assert chunking.gpu_budget_bytes("cuda:0") == 2 << 30
    assert chunking.gpu_budget_bytes("cpu") == 2 << 30


def test_value_checks_default_on_cpu_only():
    from pml_rank_plugins.functional.backend import checks_values

    assert checks_values("cpu") and not checks_values("gpu") and not checks_values("triton")
    assert checks_values("gpu", True) and not checks_values("cpu", False)


@pytest.mark.parametrize("name", ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss", "Miner"])
def test_every_loss_and_the_miner_ask_the_rule_with_their_embeddings_dtype(monkeypatch, name):
    from pml_rank_plugins import losses
    from pml_rank_plugins.miners import RankedListMiner

    asked = []

    def recording(device, dtype=None):
        asked.append((torch.device(device).type, dtype))
        return "cpu"

    monkeypatch.setattr(backend_module, "auto_backend", recording)
    make = RankedListMiner if name == "Miner" else getattr(losses, name)
    emb = torch.randn(8, 4, dtype=torch.float64)
    make()(emb, torch.arange(8) % 2)
    assert asked and set(asked) == {("cpu", torch.float64)}
