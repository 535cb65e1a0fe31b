#include "models/common/cpu_gemm.h"

#include <ATen/ATen.h>
#include <dlfcn.h>

#include <atomic>

#include "core/error.h"

namespace fluxmpi::nn::cpu {
namespace {

// oneDNN's C entry points (dnnl.h declares the first; the bf16 one is exported with the same
// row-major convention but declared only in oneDNN's own tests). Both return dnnl_status_t,
// 0 = dnnl_success.
using SgemmFn = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
using Bf16GemmFn = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                           int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

struct OneDnn {
  SgemmFn sgemm = nullptr;
  Bf16GemmFn bf16 = nullptr;
  // The OpenMP runtime's thread count of the calling task (omp.h), from the runtime libtorch and
  // oneDNN share; absent where oneDNN runs on another threading runtime.
  int (*omp_get_max_threads)() = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;
  OneDnn() {
    omp_get_max_threads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    omp_set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (omp_get_max_threads == nullptr || omp_set_num_threads == nullptr) omp_get_max_threads = nullptr;
    sgemm = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "dnnl_sgemm"));
    bf16 = reinterpret_cast<Bf16GemmFn>(dlsym(RTLD_DEFAULT, "dnnl_gemm_bf16bf16f32"));
    // A 1 x 1 product of length 2 as the probe: the bf16 GEMM reports "unimplemented" on CPUs
    // without AVX-512, and a wrong answer would mean a different calling convention.
    if (sgemm != nullptr) {
      const float a[2] = {1.5f, -2.0f}, b[2] = {2.0f, 0.25f};
      float c = 7;
      if (sgemm('N', 'T', 1, 1, 2, 1.0f, a, 2, b, 2, 0.0f, &c, 1) != 0 || c != 2.5f) sgemm = nullptr;
    }
    if (bf16 != nullptr) {
      const c10::BFloat16 a[2] = {1.5f, -2.0f}, b[2] = {2.0f, 0.25f};
      float c = 7;
      if (bf16('N', 'T', 1, 1, 2, 1.0f, &a[0].x, 2, &b[0].x, 2, 0.0f, &c, 1) != 0 || c != 2.5f) bf16 = nullptr;
    }
  }
};

const OneDnn& onednn() {
  static const OneDnn d;
  return d;
}

std::atomic<bool> force_libtorch{false};

// oneDNN sizes a GEMM's thread team by omp_get_max_threads(), also inside a parallel region,
// where OpenMP then gives its nested team one thread: the GEMM is cut for two threads and run by
// one, and on a loaded machine the idle threads' spinning made a tiled attention 10x slower
// (measured). One thread for the call, on the calling thread; the setting is the calling task's
// own and is restored.
class OneThread {
 public:
  OneThread() : saved_(onednn().omp_get_max_threads ? onednn().omp_get_max_threads() : 1) {
    if (saved_ != 1) onednn().omp_set_num_threads(1);
  }
  ~OneThread() {
    if (saved_ != 1) onednn().omp_set_num_threads(saved_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

// The libtorch fallback: views of the raw matrices, one addmm into C, in float.
void libtorch_gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha, const at::Tensor& a,
                   const at::Tensor& b, float beta, float* C, int64_t ldc) {
  at::Tensor c = at::from_blob(C, {M, N}, {ldc, 1}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor bb = transpose_b ? b.t() : b;
  if (beta == 0.0f) {
    at::mm_out(c, a, bb);
    if (alpha != 1.0f) c.mul_(alpha);
  } else {
    at::addmm_out(c, c, a, bb, beta, alpha);
  }
}

at::Tensor view(const float* p, int64_t rows, int64_t cols, int64_t ld) {
  return at::from_blob(const_cast<float*>(p), {rows, cols}, {ld, 1}, at::TensorOptions().dtype(at::kFloat));
}
at::Tensor float_copy(const c10::BFloat16* p, int64_t rows, int64_t cols, int64_t ld) {
  return at::from_blob(const_cast<c10::BFloat16*>(p), {rows, cols}, {ld, 1}, at::TensorOptions().dtype(at::kBFloat16))
      .to(at::kFloat);
}

void check_dims(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool transpose_b) {
  FLUX_CHECK(M >= 0 && N >= 0 && K >= 0 && lda >= K && ldb >= (transpose_b ? K : N) && ldc >= N, "gemm: M ", M, " N ", N,
             " K ", K, " with leading dimensions ", lda, ", ", ldb, ", ", ldc);
}

}  // namespace

GemmProvider gemm_provider_f32() {
  return onednn().sgemm != nullptr && !force_libtorch ? GemmProvider::OneDnn : GemmProvider::Libtorch;
}
GemmProvider gemm_provider_bf16() {
  return onednn().bf16 != nullptr && !force_libtorch ? GemmProvider::OneDnn : GemmProvider::Libtorch;
}
void force_gemm_provider(GemmProvider provider) { force_libtorch = provider == GemmProvider::Libtorch; }

void gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  check_dims(M, N, K, lda, ldb, ldc, transpose_b);
  if (M == 0 || N == 0) return;
  if (gemm_provider_f32() == GemmProvider::OneDnn) {
    OneThread one;
    const int status = onednn().sgemm('N', transpose_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    FLUX_CHECK(status == 0, "dnnl_sgemm failed with status ", status, " (M ", M, " N ", N, " K ", K, ")");
    return;
  }
  libtorch_gemm(transpose_b, M, N, K, alpha, view(A, M, K, lda),
                transpose_b ? view(B, N, K, ldb) : view(B, K, N, ldb), beta, C, ldc);
}

void gemm_threads(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc) {
  check_dims(M, N, K, lda, ldb, ldc, false);
  FLUX_CHECK(gemm_provider_f32() == GemmProvider::OneDnn, "gemm_threads needs oneDNN's sgemm");
  if (M == 0 || N == 0) return;
  const int status = onednn().sgemm('N', 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  FLUX_CHECK(status == 0, "dnnl_sgemm failed with status ", status, " (M ", M, " N ", N, " K ", K, ")");
}

void gemm(bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha, const c10::BFloat16* A, int64_t lda,
          const c10::BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_dims(M, N, K, lda, ldb, ldc, transpose_b);
  if (M == 0 || N == 0) return;
  if (gemm_provider_bf16() == GemmProvider::OneDnn) {
    OneThread one;
    const int status = onednn().bf16('N', transpose_b ? 'T' : 'N', M, N, K, alpha, &A->x, lda, &B->x, ldb, beta, C, ldc);
    FLUX_CHECK(status == 0, "dnnl_gemm_bf16bf16f32 failed with status ", status, " (M ", M, " N ", N, " K ", K, ")");
    return;
  }
  libtorch_gemm(transpose_b, M, N, K, alpha, float_copy(A, M, K, lda),
                transpose_b ? float_copy(B, N, K, ldb) : float_copy(B, K, N, ldb), beta, C, ldc);
}

}  // namespace fluxmpi::nn::cpu
