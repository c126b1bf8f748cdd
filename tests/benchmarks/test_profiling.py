"""flashspec_bench.profiling (benchmarks/profile_fast.py): what it calls each kernel it profiles."""

from __future__ import annotations

import pytest

from flashspec_bench import profiling


@pytest.mark.parametrize(("name", "kind"), [
    ("_nf4_kernel", "nf4"),  # the fused dequantize-GEMM, apart from the GEMMs it replaces
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),  # "sm90" too: attention wins
    ("_decode_attn_kernel", "attention"),
    ("rope_store_kernel", "rope_store"),
    ("triton_poi_fused_add_mul_0", "fused_elementwise"),
    ("void at::native::index_elementwise_kernel", "copy_index"),
    ("_gemv_kernel", "gemm"),
    ("something_else", "other"),
])
def test_kernel_kinds(name: str, kind: str) -> None:
    assert profiling.kind(name) == kind
