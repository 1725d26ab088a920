/* A stand-in cuRAND (libcurand.so.10) for the stand-in CUDA runtime (cudart.c): generators that generate nothing.
 * The device buffers they would fill stay as they are (untouched pages cost nothing); what the stand-in measures
 * is memory, never numbers. For measurement only: nothing in digits_memplugin loads it. */
#include <curand.h>
#include <stdlib.h>

#include "standin.h"

#define EXPORT STANDIN_EXPORT

struct curandGenerator_st {
  curandRngType_t type;
  unsigned long long seed, offset;
  cudaStream_t stream;
};

EXPORT curandStatus_t curandCreateGenerator(curandGenerator_t *generator, curandRngType_t rng_type) {
  if (!generator) return CURAND_STATUS_NOT_INITIALIZED;
  *generator = calloc(1, sizeof(struct curandGenerator_st));
  if (!*generator) return CURAND_STATUS_ALLOCATION_FAILED;
  (*generator)->type = rng_type;
  return CURAND_STATUS_SUCCESS;
}

EXPORT curandStatus_t curandCreateGeneratorHost(curandGenerator_t *generator, curandRngType_t rng_type) {
  return curandCreateGenerator(generator, rng_type);
}

EXPORT curandStatus_t curandDestroyGenerator(curandGenerator_t generator) {
  free(generator);
  return CURAND_STATUS_SUCCESS;
}

EXPORT curandStatus_t curandSetPseudoRandomGeneratorSeed(curandGenerator_t generator, unsigned long long seed) {
  if (!generator) return CURAND_STATUS_NOT_INITIALIZED;
  generator->seed = seed;
  return CURAND_STATUS_SUCCESS;
}

EXPORT curandStatus_t curandSetGeneratorOffset(curandGenerator_t generator, unsigned long long offset) {
  if (!generator) return CURAND_STATUS_NOT_INITIALIZED;
  generator->offset = offset;
  return CURAND_STATUS_SUCCESS;
}

EXPORT curandStatus_t curandSetStream(curandGenerator_t generator, cudaStream_t stream) {
  if (!generator) return CURAND_STATUS_NOT_INITIALIZED;
  generator->stream = stream;
  return CURAND_STATUS_SUCCESS;
}

EXPORT curandStatus_t curandGetVersion(int *version) {
  if (version) *version = CURAND_VERSION;
  return CURAND_STATUS_SUCCESS;
}

EXPORT curandStatus_t curandGenerate(curandGenerator_t generator, unsigned int *outputPtr, size_t num) {
  (void)outputPtr; (void)num;
  return generator ? CURAND_STATUS_SUCCESS : CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT curandStatus_t curandGenerateUniform(curandGenerator_t generator, float *outputPtr, size_t num) {
  (void)outputPtr; (void)num;
  return generator ? CURAND_STATUS_SUCCESS : CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT curandStatus_t curandGenerateUniformDouble(curandGenerator_t generator, double *outputPtr, size_t num) {
  (void)outputPtr; (void)num;
  return generator ? CURAND_STATUS_SUCCESS : CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT curandStatus_t curandGenerateNormal(curandGenerator_t generator, float *outputPtr, size_t n, float mean,
                                           float stddev) {
  (void)outputPtr; (void)n; (void)mean; (void)stddev;
  return generator ? CURAND_STATUS_SUCCESS : CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT curandStatus_t curandGenerateNormalDouble(curandGenerator_t generator, double *outputPtr, size_t n,
                                                 double mean, double stddev) {
  (void)outputPtr; (void)n; (void)mean; (void)stddev;
  return generator ? CURAND_STATUS_SUCCESS : CURAND_STATUS_NOT_INITIALIZED;
}
