#pragma once
/// Small single-call GEMMs on raw CPU memory for kernels that tile their own loops (the tiled
/// attention): row-major C[M, N] = alpha * A[M, K] * op(B) + beta * C, op(B) = B stored [K, N] or
/// B^T (B stored [N, K]); every matrix with its own leading dimension (row stride).
///
/// They call oneDNN's GEMMs (dnnl_sgemm, and dnnl_gemm_bf16bf16f32: bf16 inputs, float
/// accumulation and output), from the oneDNN that libtorch's CPU build loads into the process
/// (Debian 12's libtorch 1.13 links libdnnl.so.2, Debian 13's 2.6 libdnnl.so.3). Per call they
/// cost about a microsecond where a libtorch operator costs several, which matters for tiles of a
/// few dozen rows. They always run on the calling thread alone (meant to be called from the tasks
/// of an at::parallel_for). Where the process has no such oneDNN, or its
/// bf16 GEMM is unimplemented on this CPU (no AVX-512), the same products go through libtorch's
/// matmul on float copies of the tiles (bf16 products are exact in float): slower, same
/// arithmetic up to the order of the sums.

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace fluxmpi::nn::cpu {

/// Which implementation the GEMMs below take: oneDNN, or libtorch's matmul.
enum class GemmProvider { OneDnn, Libtorch };
/// The provider of fp32 and of bf16 GEMMs in this process (decided at the first call).
GemmProvider gemm_provider_f32();
GemmProvider gemm_provider_bf16();
/// Tests: make every later GEMM take `provider` (OneDnn where the process has none is ignored).
void force_gemm_provider(GemmProvider provider);

void gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha, const c10::BFloat16* A, int64_t lda,
          const c10::BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// C[M, N] = A[M, K] * B[K, N] + beta * C, all row-major float, on the process's OpenMP threads
/// (oneDNN's own partition of the product): for a caller outside any parallel region, where
/// oneDNN is the provider (nn::linear).
void gemm_threads(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc);

}  // namespace fluxmpi::nn::cpu
