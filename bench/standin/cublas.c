/* A stand-in cuBLAS (libcublas.so.13) for the stand-in CUDA runtime (cudart.c): handles that do nothing and BLAS
 * calls that compute nothing. A call that returns a scalar to the host (dot, asum, nrm2) returns 0, so that the
 * program goes on; what it measures is memory, never arithmetic. For measurement only: nothing in digits_memplugin
 * loads it. */
#include <cublas_v2.h>
#include <stdlib.h>

#include "standin.h"

#define EXPORT STANDIN_EXPORT

struct cublasContext {
  cudaStream_t stream;
  cublasPointerMode_t pointer_mode;
  cublasMath_t math_mode;
};

EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = calloc(1, sizeof(struct cublasContext));
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  free(handle);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version) {
  (void)handle;
  if (version) *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream) *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode) *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode) *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT const char *cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "cuBLAS error (digits-memplugin stand-in)";
}

/* Level 1, 2 and 3 in both precisions: arguments checked for a handle, nothing computed. */
#define NOTHING(handle) return (handle) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED

#define GEMM(T, name)                                                                                        \
  EXPORT cublasStatus_t name(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,      \
                             int m, int n, int k, const T *alpha, const T *A, int lda, const T *B, int ldb, \
                             const T *beta, T *C, int ldc) {                                                 \
    (void)transa; (void)transb; (void)m; (void)n; (void)k; (void)alpha; (void)A; (void)lda; (void)B;         \
    (void)ldb; (void)beta; (void)C; (void)ldc;                                                               \
    NOTHING(handle);                                                                                         \
  }
GEMM(float, cublasSgemm_v2)
GEMM(double, cublasDgemm_v2)

#define GEMV(T, name)                                                                                         \
  EXPORT cublasStatus_t name(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const T *alpha,   \
                             const T *A, int lda, const T *x, int incx, const T *beta, T *y, int incy) {      \
    (void)trans; (void)m; (void)n; (void)alpha; (void)A; (void)lda; (void)x; (void)incx; (void)beta;          \
    (void)y; (void)incy;                                                                                      \
    NOTHING(handle);                                                                                          \
  }
GEMV(float, cublasSgemv_v2)
GEMV(double, cublasDgemv_v2)

#define AXPY(T, name)                                                                                          \
  EXPORT cublasStatus_t name(cublasHandle_t handle, int n, const T *alpha, const T *x, int incx, T *y,       \
                             int incy) {                                                                       \
    (void)n; (void)alpha; (void)x; (void)incx; (void)y; (void)incy;                                            \
    NOTHING(handle);                                                                                           \
  }
AXPY(float, cublasSaxpy_v2)
AXPY(double, cublasDaxpy_v2)

#define SCAL(T, name)                                                                                      \
  EXPORT cublasStatus_t name(cublasHandle_t handle, int n, const T *alpha, T *x, int incx) {              \
    (void)n; (void)alpha; (void)x; (void)incx;                                                             \
    NOTHING(handle);                                                                                       \
  }
SCAL(float, cublasSscal_v2)
SCAL(double, cublasDscal_v2)

#define COPY(T, name)                                                                                        \
  EXPORT cublasStatus_t name(cublasHandle_t handle, int n, const T *x, int incx, T *y, int incy) {          \
    (void)n; (void)x; (void)incx; (void)y; (void)incy;                                                       \
    NOTHING(handle);                                                                                         \
  }
COPY(float, cublasScopy_v2)
COPY(double, cublasDcopy_v2)

#define DOT(T, name)                                                                                              \
  EXPORT cublasStatus_t name(cublasHandle_t handle, int n, const T *x, int incx, const T *y, int incy,           \
                             T *result) {                                                                         \
    (void)n; (void)x; (void)incx; (void)y; (void)incy;                                                            \
    if (result) *result = 0;                                                                                      \
    NOTHING(handle);                                                                                              \
  }
DOT(float, cublasSdot_v2)
DOT(double, cublasDdot_v2)

#define REDUCE(T, name)                                                                                        \
  EXPORT cublasStatus_t name(cublasHandle_t handle, int n, const T *x, int incx, T *result) {                 \
    (void)n; (void)x; (void)incx;                                                                              \
    if (result) *result = 0;                                                                                   \
    NOTHING(handle);                                                                                           \
  }
REDUCE(float, cublasSasum_v2)
REDUCE(double, cublasDasum_v2)
REDUCE(float, cublasSnrm2_v2)
REDUCE(double, cublasDnrm2_v2)
