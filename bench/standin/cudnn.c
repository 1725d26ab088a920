/* A stand-in cuDNN (libcudnn.so.9) for the stand-in CUDA runtime (cudart.c): descriptors that keep their shapes,
 * operations that compute nothing, and convolution algorithm queries answered from one stated assumption, every
 * answer recorded in the stand-in's report (section "cudnn").
 *
 * The assumption (what a real cuDNN picks is only known on the GPU): for each direction (forward, backward filter,
 * backward data) the fastest algorithm is a GEMM one (CUDNN_CONVOLUTION_FWD_ALGO_GEMM, BWD_FILTER_ALGO_1,
 * BWD_DATA_ALGO_1) whose workspace is one group's im2col matrix of one image, (C/group) x kh x kw x Hout x Wout
 * elements; the next needs no workspace (FWD_ALGO_IMPLICIT_GEMM, BWD_FILTER_ALGO_0, BWD_DATA_ALGO_0). Caffe then
 * takes the first within its limit (8 MiB per layer), so a layer whose matrix is larger gets no workspace.
 *
 * Not modelled: the device memory a real cuDNN handle allocates for itself. For measurement only: nothing in
 * digits_memplugin loads it. */
#include <cudnn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

#define EXPORT STANDIN_EXPORT
#define MAX_REQUESTS 4096

static const char ASSUMPTION[] =
    "stand-in cuDNN: for each direction the fastest algorithm (FWD_ALGO_GEMM, BWD_FILTER_ALGO_1, BWD_DATA_ALGO_1) "
    "needs one group's im2col matrix of one image, (C/group) x kh x kw x Hout x Wout elements of the data type; the "
    "next (FWD_ALGO_IMPLICIT_GEMM, BWD_FILTER_ALGO_0, BWD_DATA_ALGO_0) needs none. Not the algorithm a real cuDNN "
    "picks, and no memory of cuDNN's own handles";

struct cudnnContext { cudaStream_t stream; };
struct cudnnTensorStruct { cudnnDataType_t type; int n, c, h, w, ns, cs, hs, ws; };
struct cudnnFilterStruct { cudnnDataType_t type; int k, c, h, w; };
struct cudnnConvolutionStruct { int pad_h, pad_w, u, v, dilation_h, dilation_w; cudnnDataType_t type; };
struct cudnnPoolingStruct { cudnnPoolingMode_t mode; int h, w, pad_h, pad_w, stride_h, stride_w; };
struct cudnnLRNStruct { unsigned n; double alpha, beta, k; };
struct cudnnActivationStruct { cudnnActivationMode_t mode; double coef; };

typedef struct {
  const char *direction;
  int algo;
  int n, c, h, w, group, k, kh, kw, out_h, out_w, pad_h, pad_w, stride_h, stride_w;
  size_t bytes, count;
} request_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static request_t requests[MAX_REQUESTS];
static size_t request_count, dropped_requests, handles_created, handles_live;

static void write_section(FILE *out) {
  pthread_mutex_lock(&lock);
  fputs("{\n    \"assumption\": ", out);
  digits_memplugin_standin_json_string(out, ASSUMPTION);
  fprintf(out, ",\n    \"handles_created\": %zu,\n    \"handles_live\": %zu,\n    \"dropped_requests\": %zu,\n"
          "    \"workspace_requests\": [", handles_created, handles_live, dropped_requests);
  for (size_t i = 0; i < request_count; ++i) {
    const request_t *r = &requests[i];
    fprintf(out,
            "%s\n      {\"direction\": \"%s\", \"algo\": %d, \"bottom\": [%d, %d, %d, %d], \"group\": %d, "
            "\"num_output\": %d, \"kernel\": [%d, %d], \"top\": [%d, %d], \"pad\": [%d, %d], \"stride\": [%d, %d], "
            "\"bytes\": %zu, \"count\": %zu}",
            i ? "," : "", r->direction, r->algo, r->n, r->c, r->h, r->w, r->group, r->k, r->kh, r->kw, r->out_h,
            r->out_w, r->pad_h, r->pad_w, r->stride_h, r->stride_w, r->bytes, r->count);
  }
  fputs("\n    ]\n  }", out);
  pthread_mutex_unlock(&lock);
}

__attribute__((constructor)) static void cudnn_standin_init(void) {
  digits_memplugin_standin_add_section("cudnn", write_section);
}

static size_t element_bytes(cudnnDataType_t type) {
  switch (type) {
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: return 1;
    default: return 4;
  }
}

/* One group's im2col matrix of one image, and the answer recorded. `x` is the convolution's input (bottom), `y`
 * its output, both described per group as Caffe describes them (channels / group, the whole image's strides). */
static size_t workspace(const char *direction, int algo, int gemm_algo, cudnnTensorDescriptor_t x,
                        cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y) {
  if (!x || !w || !conv || !y) return 0;
  size_t bytes = algo == gemm_algo ? (size_t)w->c * w->h * w->w * y->h * y->w * element_bytes(x->type) : 0;
  int per_image = x->c * x->h * x->w;
  int group = per_image > 0 && x->ns % per_image == 0 ? x->ns / per_image : 1;
  pthread_mutex_lock(&lock);
  request_t probe = {direction, algo, x->n, x->c * group, x->h, x->w, group, w->k * group, w->h, w->w, y->h, y->w,
                     conv->pad_h, conv->pad_w, conv->u, conv->v, bytes, 1};
  size_t i = 0;
  for (; i < request_count; ++i) {
    request_t *r = &requests[i];
    if (r->direction == direction && r->algo == algo && r->n == probe.n && r->c == probe.c && r->h == probe.h &&
        r->w == probe.w && r->group == group && r->k == probe.k && r->kh == probe.kh && r->kw == probe.kw &&
        r->out_h == probe.out_h && r->out_w == probe.out_w && r->pad_h == probe.pad_h && r->pad_w == probe.pad_w &&
        r->stride_h == probe.stride_h && r->stride_w == probe.stride_w) {
      r->count++;
      break;
    }
  }
  if (i == request_count) {
    if (request_count < MAX_REQUESTS) requests[request_count++] = probe;
    else dropped_requests++;
  }
  pthread_mutex_unlock(&lock);
  return bytes;
}

/* --- handles and errors */

EXPORT size_t cudnnGetVersion(void) { return CUDNN_VERSION; }
EXPORT size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }

EXPORT const char *cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "cuDNN error (digits-memplugin stand-in)";
}

EXPORT cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  *handle = calloc(1, sizeof(struct cudnnContext));
  if (!*handle) return CUDNN_STATUS_ALLOC_FAILED;
  pthread_mutex_lock(&lock);
  handles_created++;
  handles_live++;
  pthread_mutex_unlock(&lock);
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (handle) {
    pthread_mutex_lock(&lock);
    handles_live--;
    pthread_mutex_unlock(&lock);
  }
  free(handle);
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId) {
  if (!handle || !streamId) return CUDNN_STATUS_BAD_PARAM;
  *streamId = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

/* --- descriptors */

#define DESCRIPTOR(type_t, create, destroy)                          \
  EXPORT cudnnStatus_t create(type_t *desc) {                        \
    if (!desc) return CUDNN_STATUS_BAD_PARAM;                        \
    *desc = calloc(1, sizeof **desc);                                \
    return *desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED; \
  }                                                                  \
  EXPORT cudnnStatus_t destroy(type_t desc) {                        \
    free(desc);                                                      \
    return CUDNN_STATUS_SUCCESS;                                     \
  }
DESCRIPTOR(cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor)
DESCRIPTOR(cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor)
DESCRIPTOR(cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor)
DESCRIPTOR(cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor)
DESCRIPTOR(cudnnLRNDescriptor_t, cudnnCreateLRNDescriptor, cudnnDestroyLRNDescriptor)
DESCRIPTOR(cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor)

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                                  int n, int c, int h, int w, int nStride, int cStride, int hStride,
                                                  int wStride) {
  if (!tensorDesc || n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *tensorDesc = (struct cudnnTensorStruct){dataType, n, c, h, w, nStride, cStride, hStride, wStride};
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                                cudnnDataType_t dataType, int n, int c, int h, int w) {
  (void)format;
  return cudnnSetTensor4dDescriptorEx(tensorDesc, dataType, n, c, h, w, c * h * w, h * w, w, 1);
}

EXPORT cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                                cudnnTensorFormat_t format, int k, int c, int h, int w) {
  (void)format;
  if (!filterDesc || k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *filterDesc = (struct cudnnFilterStruct){dataType, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w,
                                                     int u, int v, int dilation_h, int dilation_w,
                                                     cudnnConvolutionMode_t mode, cudnnDataType_t computeType) {
  (void)mode;
  if (!convDesc || u <= 0 || v <= 0) return CUDNN_STATUS_BAD_PARAM;
  *convDesc = (struct cudnnConvolutionStruct){pad_h, pad_w, u, v, dilation_h, dilation_w, computeType};
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t poolingDesc, cudnnPoolingMode_t mode,
                                                 cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight,
                                                 int windowWidth, int verticalPadding, int horizontalPadding,
                                                 int verticalStride, int horizontalStride) {
  (void)maxpoolingNanOpt;
  if (!poolingDesc) return CUDNN_STATUS_BAD_PARAM;
  *poolingDesc = (struct cudnnPoolingStruct){mode, windowHeight, windowWidth, verticalPadding, horizontalPadding,
                                             verticalStride, horizontalStride};
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetLRNDescriptor(cudnnLRNDescriptor_t normDesc, unsigned lrnN, double lrnAlpha,
                                           double lrnBeta, double lrnK) {
  if (!normDesc) return CUDNN_STATUS_BAD_PARAM;
  *normDesc = (struct cudnnLRNStruct){lrnN, lrnAlpha, lrnBeta, lrnK};
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
                                                  cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt,
                                                  double coef) {
  (void)reluNanOpt;
  if (!activationDesc) return CUDNN_STATUS_BAD_PARAM;
  *activationDesc = (struct cudnnActivationStruct){mode, coef};
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
                                                   const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode) {
  if (!derivedBnDesc || !xDesc) return CUDNN_STATUS_BAD_PARAM;
  int h = mode == CUDNN_BATCHNORM_PER_ACTIVATION ? xDesc->h : 1, w = mode == CUDNN_BATCHNORM_PER_ACTIVATION ? xDesc->w : 1;
  cudnnDataType_t type = xDesc->type == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  return cudnnSetTensor4dDescriptorEx(derivedBnDesc, type, 1, xDesc->c, h, w, xDesc->c * h * w, h * w, w, 1);
}

/* --- convolution algorithms and their workspaces: the assumption above */

#define PERF(perf, index, algorithm, bytes)          \
  do {                                               \
    memset(&(perf)[index], 0, sizeof (perf)[index]); \
    (perf)[index].algo = (algorithm);                \
    (perf)[index].status = CUDNN_STATUS_SUCCESS;     \
    (perf)[index].time = (float)(index + 1);         \
    (perf)[index].memory = (bytes);                  \
    (perf)[index].determinism = CUDNN_DETERMINISTIC; \
    (perf)[index].mathType = CUDNN_DEFAULT_MATH;     \
  } while (0)

static size_t im2col_bytes(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t y) {
  return x && w && y ? (size_t)w->c * w->h * w->w * y->h * y->w * element_bytes(x->type) : 0;
}

EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults) {
  (void)convDesc;
  if (!handle || !returnedAlgoCount || !perfResults || requestedAlgoCount <= 0) return CUDNN_STATUS_BAD_PARAM;
  PERF(perfResults, 0, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, im2col_bytes(srcDesc, filterDesc, destDesc));
  if (requestedAlgoCount > 1) PERF(perfResults, 1, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 0);
  *returnedAlgoCount = requestedAlgoCount > 1 ? 2 : 1;
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnFilterDescriptor_t wDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnTensorDescriptor_t yDesc,
                                                             cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes) {
  if (!handle || !sizeInBytes) return CUDNN_STATUS_BAD_PARAM;
  *sizeInBytes = workspace("forward", algo, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, xDesc, wDesc, convDesc, yDesc);
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t *perfResults) {
  (void)convDesc;
  if (!handle || !returnedAlgoCount || !perfResults || requestedAlgoCount <= 0) return CUDNN_STATUS_BAD_PARAM;
  PERF(perfResults, 0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, im2col_bytes(srcDesc, gradDesc, diffDesc));
  if (requestedAlgoCount > 1) PERF(perfResults, 1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, 0);
  *returnedAlgoCount = requestedAlgoCount > 1 ? 2 : 1;
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes) {
  if (!handle || !sizeInBytes) return CUDNN_STATUS_BAD_PARAM;
  *sizeInBytes = workspace("backward_filter", algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, xDesc, gradDesc, convDesc,
                           dyDesc);
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t *perfResults) {
  (void)convDesc;
  if (!handle || !returnedAlgoCount || !perfResults || requestedAlgoCount <= 0) return CUDNN_STATUS_BAD_PARAM;
  PERF(perfResults, 0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, im2col_bytes(gradDesc, filterDesc, diffDesc));
  if (requestedAlgoCount > 1) PERF(perfResults, 1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, 0);
  *returnedAlgoCount = requestedAlgoCount > 1 ? 2 : 1;
  return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
  if (!handle || !sizeInBytes) return CUDNN_STATUS_BAD_PARAM;
  *sizeInBytes = workspace("backward_data", algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, dxDesc, wDesc, convDesc,
                           dyDesc);
  return CUDNN_STATUS_SUCCESS;
}

/* --- operations: nothing computed */

#define DONE(handle) return (handle) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM

EXPORT cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnFilterDescriptor_t wDesc, const void *w,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnTensorDescriptor_t yDesc, void *y) {
  (void)alpha; (void)xDesc; (void)x; (void)wDesc; (void)w; (void)convDesc; (void)algo; (void)workSpace;
  (void)workSpaceSizeInBytes; (void)beta; (void)yDesc; (void)y;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                                    const cudnnTensorDescriptor_t xDesc, const void *x,
                                                    const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                                    const cudnnConvolutionDescriptor_t convDesc,
                                                    cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                                    size_t workSpaceSizeInBytes, const void *beta,
                                                    const cudnnFilterDescriptor_t dwDesc, void *dw) {
  (void)alpha; (void)xDesc; (void)x; (void)dyDesc; (void)dy; (void)convDesc; (void)algo; (void)workSpace;
  (void)workSpaceSizeInBytes; (void)beta; (void)dwDesc; (void)dw;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                                  const cudnnFilterDescriptor_t wDesc, const void *w,
                                                  const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                                  const cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                                  size_t workSpaceSizeInBytes, const void *beta,
                                                  const cudnnTensorDescriptor_t dxDesc, void *dx) {
  (void)alpha; (void)wDesc; (void)w; (void)dyDesc; (void)dy; (void)convDesc; (void)algo; (void)workSpace;
  (void)workSpaceSizeInBytes; (void)beta; (void)dxDesc; (void)dx;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
                                                  const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                                  const void *beta, const cudnnTensorDescriptor_t dbDesc, void *db) {
  (void)alpha; (void)dyDesc; (void)dy; (void)beta; (void)dbDesc; (void)db;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t aDesc,
                                    const void *A, const void *beta, const cudnnTensorDescriptor_t cDesc, void *C) {
  (void)alpha; (void)aDesc; (void)A; (void)beta; (void)cDesc; (void)C;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc,
                                         const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
                                         const void *beta, const cudnnTensorDescriptor_t yDesc, void *y) {
  (void)poolingDesc; (void)alpha; (void)xDesc; (void)x; (void)beta; (void)yDesc; (void)y;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc,
                                          const void *alpha, const cudnnTensorDescriptor_t yDesc, const void *y,
                                          const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                          const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                          const cudnnTensorDescriptor_t dxDesc, void *dx) {
  (void)poolingDesc; (void)alpha; (void)yDesc; (void)y; (void)dyDesc; (void)dy; (void)xDesc; (void)x; (void)beta;
  (void)dxDesc; (void)dx;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle, cudnnActivationDescriptor_t activationDesc,
                                            const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
                                            const void *beta, const cudnnTensorDescriptor_t yDesc, void *y) {
  (void)activationDesc; (void)alpha; (void)xDesc; (void)x; (void)beta; (void)yDesc; (void)y;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnActivationBackward(cudnnHandle_t handle, cudnnActivationDescriptor_t activationDesc,
                                             const void *alpha, const cudnnTensorDescriptor_t yDesc, const void *y,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                             const cudnnTensorDescriptor_t dxDesc, void *dx) {
  (void)activationDesc; (void)alpha; (void)yDesc; (void)y; (void)dyDesc; (void)dy; (void)xDesc; (void)x;
  (void)beta; (void)dxDesc; (void)dx;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo, cudnnSoftmaxMode_t mode,
                                         const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
                                         const void *beta, const cudnnTensorDescriptor_t yDesc, void *y) {
  (void)algo; (void)mode; (void)alpha; (void)xDesc; (void)x; (void)beta; (void)yDesc; (void)y;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo, cudnnSoftmaxMode_t mode,
                                          const void *alpha, const cudnnTensorDescriptor_t yDesc, const void *y,
                                          const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
                                          const cudnnTensorDescriptor_t dxDesc, void *dx) {
  (void)algo; (void)mode; (void)alpha; (void)yDesc; (void)y; (void)dyDesc; (void)dy; (void)beta; (void)dxDesc;
  (void)dx;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnLRNCrossChannelForward(cudnnHandle_t handle, cudnnLRNDescriptor_t normDesc,
                                                 cudnnLRNMode_t lrnMode, const void *alpha,
                                                 const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                                 const cudnnTensorDescriptor_t yDesc, void *y) {
  (void)normDesc; (void)lrnMode; (void)alpha; (void)xDesc; (void)x; (void)beta; (void)yDesc; (void)y;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnLRNCrossChannelBackward(cudnnHandle_t handle, cudnnLRNDescriptor_t normDesc,
                                                  cudnnLRNMode_t lrnMode, const void *alpha,
                                                  const cudnnTensorDescriptor_t yDesc, const void *y,
                                                  const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                                  const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                                  const cudnnTensorDescriptor_t dxDesc, void *dx) {
  (void)normDesc; (void)lrnMode; (void)alpha; (void)yDesc; (void)y; (void)dyDesc; (void)dy; (void)xDesc; (void)x;
  (void)beta; (void)dxDesc; (void)dx;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnDivisiveNormalizationForward(cudnnHandle_t handle, cudnnLRNDescriptor_t normDesc,
                                                       cudnnDivNormMode_t mode, const void *alpha,
                                                       const cudnnTensorDescriptor_t xDesc, const void *x,
                                                       const void *means, void *temp, void *temp2, const void *beta,
                                                       const cudnnTensorDescriptor_t yDesc, void *y) {
  (void)normDesc; (void)mode; (void)alpha; (void)xDesc; (void)x; (void)means; (void)temp; (void)temp2; (void)beta;
  (void)yDesc; (void)y;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnDivisiveNormalizationBackward(cudnnHandle_t handle, cudnnLRNDescriptor_t normDesc,
                                                        cudnnDivNormMode_t mode, const void *alpha,
                                                        const cudnnTensorDescriptor_t xDesc, const void *x,
                                                        const void *means, const void *dy, void *temp, void *temp2,
                                                        const void *beta, const cudnnTensorDescriptor_t dXdMeansDesc,
                                                        void *dx, void *dMeans) {
  (void)normDesc; (void)mode; (void)alpha; (void)xDesc; (void)x; (void)means; (void)dy; (void)temp; (void)temp2;
  (void)beta; (void)dXdMeansDesc; (void)dx; (void)dMeans;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    double exponentialAverageFactor, void *resultRunningMean, void *resultRunningVariance, double epsilon,
    void *resultSaveMean, void *resultSaveInvVariance) {
  (void)mode; (void)alpha; (void)beta; (void)xDesc; (void)x; (void)yDesc; (void)y; (void)bnScaleBiasMeanVarDesc;
  (void)bnScale; (void)bnBias; (void)exponentialAverageFactor; (void)resultRunningMean; (void)resultRunningVariance;
  (void)epsilon; (void)resultSaveMean; (void)resultSaveInvVariance;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    const void *estimatedMean, const void *estimatedVariance, double epsilon) {
  (void)mode; (void)alpha; (void)beta; (void)xDesc; (void)x; (void)yDesc; (void)y; (void)bnScaleBiasMeanVarDesc;
  (void)bnScale; (void)bnBias; (void)estimatedMean; (void)estimatedVariance; (void)epsilon;
  DONE(handle);
}

EXPORT cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff, const void *betaDataDiff,
    const void *alphaParamDiff, const void *betaParamDiff, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult, void *dBnBiasResult,
    double epsilon, const void *savedMean, const void *savedInvVariance) {
  (void)mode; (void)alphaDataDiff; (void)betaDataDiff; (void)alphaParamDiff; (void)betaParamDiff; (void)xDesc;
  (void)x; (void)dyDesc; (void)dy; (void)dxDesc; (void)dx; (void)dBnScaleBiasDesc; (void)bnScale;
  (void)dBnScaleResult; (void)dBnBiasResult; (void)epsilon; (void)savedMean; (void)savedInvVariance;
  DONE(handle);
}
