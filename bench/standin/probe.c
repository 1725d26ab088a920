/* A memory probe for a real GPU (libdigits_memplugin_probe.so), loaded with LD_PRELOAD by bench/device_check.py.
 *
 * It defines cudaMalloc, cudaFree, cudaMallocHost, cudaHostAlloc and cudaFreeHost under the CUDA runtime's symbol
 * version (libcudart.so.13), so that the program's calls reach it first; each call goes on to the real runtime
 * (dlvsym RTLD_NEXT) and is counted as the stand-in counts it (counter.c): the same figure, the bytes Caffe asks
 * the device for, measured on the GPU. After every device allocation it also asks the real cudaMemGetInfo, and
 * keeps the largest total - free seen: the whole device's use, CUDA context, libraries and other processes
 * included. The report (JSON) goes to the file DIGITS_MEMPLUGIN_PROBE_REPORT names, at exit and at every failed
 * allocation. Under the stand-in (the rehearsal) the same calls reach the stand-in runtime instead.
 *
 * For measurement only: nothing in digits_memplugin loads it. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include "standin.h"

#define EXPORT STANDIN_EXPORT
#define COUNTER_REPORT_ENV "DIGITS_MEMPLUGIN_PROBE_REPORT"
#define COUNTER_WHAT                                                                                            \
  "digits-memplugin memory probe on the CUDA runtime in use: bytes the program asked the device for with "    \
  "cudaMalloc (passed on to the runtime); peak_memgetinfo_used_bytes is the largest cudaMemGetInfo total - "   \
  "free seen after an allocation, the whole device's use"

#include "counter.c"

typedef cudaError_t (*malloc_t)(void **, size_t);
typedef cudaError_t (*free_t)(void *);
typedef cudaError_t (*host_alloc_t)(void **, size_t, unsigned int);
typedef cudaError_t (*memgetinfo_t)(size_t *, size_t *);

static malloc_t real_malloc, real_malloc_host;
static free_t real_free, real_free_host;
static host_alloc_t real_host_alloc;
static memgetinfo_t real_memgetinfo;
static size_t peak_used, last_total, memgetinfo_calls;
static int memgetinfo_failures;

static void counter_extra(FILE *out) {
  fprintf(out,
          ",\n  \"standin\": false,\n  \"peak_memgetinfo_used_bytes\": %zu,\n  \"memgetinfo_total_bytes\": %zu,\n"
          "  \"memgetinfo_calls\": %zu,\n  \"memgetinfo_failures\": %d",
          peak_used, last_total, memgetinfo_calls, memgetinfo_failures);
}

static void *real(const char *name) {
  void *f = dlvsym(RTLD_NEXT, name, "libcudart.so.13");
  if (!f) f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "digits-memplugin probe: the CUDA runtime has no %s\n", name);
    abort();
  }
  return f;
}

__attribute__((constructor)) static void probe_init(void) { counter_init(); }

static void resolve(void) {
  if (real_malloc) return;
  real_free = (free_t)real("cudaFree");
  real_malloc_host = (malloc_t)real("cudaMallocHost");
  real_free_host = (free_t)real("cudaFreeHost");
  real_host_alloc = (host_alloc_t)real("cudaHostAlloc");
  real_memgetinfo = (memgetinfo_t)real("cudaMemGetInfo");
  __atomic_store_n(&real_malloc, (malloc_t)real("cudaMalloc"), __ATOMIC_RELEASE);
}

/* The device's use now, as cudaMemGetInfo says (the lock held). */
static void note_device_use(void) {
  size_t free_bytes = 0, total = 0;
  memgetinfo_calls++;
  if (real_memgetinfo(&free_bytes, &total) != cudaSuccess) {
    memgetinfo_failures++;
    return;
  }
  last_total = total;
  if (total - free_bytes > peak_used) peak_used = total - free_bytes;
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
  void *caller = __builtin_return_address(0);
  resolve();
  cudaError_t error = real_malloc(devPtr, size);
  pthread_mutex_lock(&lock);
  int site = counter_site(caller, KIND_DEVICE);
  sites[site].allocations++;
  sites[site].bytes_asked += size;
  if (error == cudaSuccess && size && devPtr && *devPtr) {
    counter_add(*devPtr, size, size, site);
    note_device_use();
  } else if (error != cudaSuccess) {
    counter_failure(size, site);
    note_device_use();
    counter_write_report("failed allocation");
  }
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT cudaError_t cudaFree(void *devPtr) {
  resolve();
  size_t size, mapped;
  pthread_mutex_lock(&lock);
  if (devPtr) counter_remove(devPtr, KIND_DEVICE, &size, &mapped);
  pthread_mutex_unlock(&lock);
  return real_free(devPtr);
}

static cudaError_t counted_host(cudaError_t error, void **ptr, size_t size, void *caller) {
  if (error != cudaSuccess || !size || !ptr || !*ptr) return error;
  pthread_mutex_lock(&lock);
  int site = counter_site(caller, KIND_HOST);
  sites[site].allocations++;
  sites[site].bytes_asked += size;
  counter_add(*ptr, size, size, site);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) {
  void *caller = __builtin_return_address(0);
  resolve();
  return counted_host(real_malloc_host(ptr, size), ptr, size, caller);
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  void *caller = __builtin_return_address(0);
  resolve();
  return counted_host(real_host_alloc(pHost, size, flags), pHost, size, caller);
}

EXPORT cudaError_t cudaFreeHost(void *ptr) {
  resolve();
  size_t size, mapped;
  pthread_mutex_lock(&lock);
  if (ptr) counter_remove(ptr, KIND_HOST, &size, &mapped);
  pthread_mutex_unlock(&lock);
  return real_free_host(ptr);
}
