/* A stand-in CUDA runtime (libcudart.so.13) for measuring what Caffe asks a GPU for, on a machine without one.
 *
 * It exports the CUDA runtime entry points the CUDA build of Caffe calls, under the real soname and symbol version,
 * so that the real libcaffe, caffe binary and pycaffe run their GPU path when LD_LIBRARY_PATH puts this library in
 * front of the real one. Device memory is host memory mapped on demand (MAP_NORESERVE: an allocation nobody
 * touches costs nothing); kernel launches do nothing; copies and memsets copy (a memset to zero hands whole pages
 * back to the kernel instead of writing them); every cudaMalloc, cudaFree and cudaMallocHost is counted, by the
 * function that called it, and the peak of live device bytes is reported as JSON to the file named by
 * DIGITS_MEMPLUGIN_STANDIN_REPORT, at exit and at every failed allocation (counter.c, shared with probe.c).
 *
 * What it measures is what Caffe asks the device for: never the CUDA context, the driver's rounding of each
 * allocation, nor what cuBLAS, cuRAND or cuDNN allocate for themselves. Nothing in digits_memplugin loads it.
 *
 * Environment:
 *   DIGITS_MEMPLUGIN_STANDIN_REPORT        where to write the report (none without it)
 *   DIGITS_MEMPLUGIN_STANDIN_DEVICE_BYTES  the device's memory (default 150754820096, an H200's 143771 MiB):
 *                                          a cudaMalloc past it fails with cudaErrorMemoryAllocation, as on a GPU
 *   DIGITS_MEMPLUGIN_STANDIN_DEVICES       how many devices (default 1)
 *   DIGITS_MEMPLUGIN_STANDIN_QUIET         1: no banner on stderr
 *   DIGITS_MEMPLUGIN_LIVE                  a file kept holding the live and peak device bytes (counter.c)
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <time.h>

#include "standin.h"

#define EXPORT STANDIN_EXPORT
#define COUNTER_REPORT_ENV "DIGITS_MEMPLUGIN_STANDIN_REPORT"
#define COUNTER_WHAT                                                                                                \
  "digits-memplugin stand-in CUDA runtime (no GPU): bytes the program asked the device for with cudaMalloc, "      \
  "counted by the stand-in; not the CUDA context, the driver's rounding of each allocation, nor what cuBLAS, "     \
  "cuRAND or cuDNN would allocate for themselves"
#define DEFAULT_DEVICE_BYTES 150754820096ULL /* 143771 MiB: an H200 as nvidia-smi reports it */

#include "counter.c"

static size_t device_bytes = DEFAULT_DEVICE_BYTES, page_bytes = 4096;
static int device_count = 1;
static size_t memset_calls, memcpy_calls, memcpy_bytes, launches;
static __thread cudaError_t last_error = cudaSuccess;
static __thread int current_device = 0;

static void counter_extra(FILE *out) {
  fprintf(out,
          ",\n  \"standin\": true,\n  \"device_bytes\": %zu,\n  \"devices\": %d,\n  \"kernel_launches\": %zu,\n"
          "  \"memcpy_calls\": %zu,\n  \"memcpy_bytes\": %zu,\n  \"memset_calls\": %zu",
          device_bytes, device_count, launches, memcpy_calls, memcpy_bytes, memset_calls);
}

__attribute__((constructor)) static void standin_init(void) {
  const char *bytes = getenv("DIGITS_MEMPLUGIN_STANDIN_DEVICE_BYTES");
  if (bytes && *bytes) device_bytes = strtoull(bytes, NULL, 10);
  const char *devices = getenv("DIGITS_MEMPLUGIN_STANDIN_DEVICES");
  if (devices && *devices) device_count = atoi(devices);
  long page = sysconf(_SC_PAGESIZE);
  if (page > 0) page_bytes = (size_t)page;
  const char *quiet = getenv("DIGITS_MEMPLUGIN_STANDIN_QUIET");
  if (!quiet || strcmp(quiet, "1") != 0)
    fprintf(stderr, "%s; device memory %zu bytes\n", COUNTER_WHAT, device_bytes);
  counter_init();
}

static cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

/* --- memory */

static cudaError_t device_malloc(void **ptr, size_t size, void *caller) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  pthread_mutex_lock(&lock);
  int site = counter_site(caller, KIND_DEVICE);
  sites[site].allocations++;
  sites[site].bytes_asked += size;
  if (size > device_bytes || live_device > device_bytes - size) {
    counter_failure(size, site);
    counter_write_report("failed allocation");
    pthread_mutex_unlock(&lock);
    return fail(cudaErrorMemoryAllocation);
  }
  size_t mapped = (size + page_bytes - 1) / page_bytes * page_bytes;
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    /* The host's address space ran out before the stand-in's device did: say so, never pass it for a GPU's OOM. */
    fprintf(stderr, "digits-memplugin stand-in: mmap of %zu bytes failed (%s): the host ran out, not the device\n",
            mapped, strerror(errno));
    pthread_mutex_unlock(&lock);
    abort();
  }
  counter_add(p, size, mapped, site);
  pthread_mutex_unlock(&lock);
  *ptr = p;
  return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
  return device_malloc(devPtr, size, __builtin_return_address(0));
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
  (void)stream;
  return device_malloc(devPtr, size, __builtin_return_address(0));
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  (void)flags;
  return device_malloc(devPtr, size, __builtin_return_address(0));
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
  size_t row = (width + 511) / 512 * 512;
  if (pitch) *pitch = row;
  return device_malloc(devPtr, row * height, __builtin_return_address(0));
}

static cudaError_t release(void *ptr, int kind) {
  if (!ptr) return cudaSuccess;
  size_t size, mapped;
  pthread_mutex_lock(&lock);
  int gone = counter_remove(ptr, kind, &size, &mapped);
  pthread_mutex_unlock(&lock);
  if (gone != 0) return fail(cudaErrorInvalidValue);
  munmap(ptr, mapped);
  return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *devPtr) { return release(devPtr, KIND_DEVICE); }

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
  (void)stream;
  return release(devPtr, KIND_DEVICE);
}

static cudaError_t host_malloc(void **ptr, size_t size, void *caller) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  size_t mapped = (size + page_bytes - 1) / page_bytes * page_bytes;
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&lock);
  int site = counter_site(caller, KIND_HOST);
  sites[site].allocations++;
  sites[site].bytes_asked += size;
  counter_add(p, size, mapped, site);
  pthread_mutex_unlock(&lock);
  *ptr = p;
  return cudaSuccess;
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) { return host_malloc(ptr, size, __builtin_return_address(0)); }

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  (void)flags;
  return host_malloc(pHost, size, __builtin_return_address(0));
}

EXPORT cudaError_t cudaFreeHost(void *ptr) { return release(ptr, KIND_HOST); }

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  pthread_mutex_lock(&lock);
  if (free_bytes) *free_bytes = device_bytes - live_device;
  if (total) *total = device_bytes;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

static void copy(void *dst, const void *src, size_t count) {
  if (count && dst != src) memmove(dst, src, count);
  __atomic_add_fetch(&memcpy_calls, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&memcpy_bytes, count, __ATOMIC_RELAXED);
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind;
  copy(dst, src, count);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                   cudaStream_t stream) {
  (void)kind;
  (void)stream;
  copy(dst, src, count);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count) {
  (void)dstDevice;
  (void)srcDevice;
  copy(dst, src, count);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                       cudaStream_t stream) {
  (void)dstDevice;
  (void)srcDevice;
  (void)stream;
  copy(dst, src, count);
  return cudaSuccess;
}

/* A memset: zero over whole pages of a device allocation gives the pages back (they read as zero again, and cost
 * nothing until written), so that Caffe's zeroing of every new buffer does not touch it. */
static void set(void *ptr, int value, size_t count) {
  __atomic_add_fetch(&memset_calls, 1, __ATOMIC_RELAXED);
  if (!count) return;
  if (value == 0) {
    pthread_mutex_lock(&lock);
    entry_t *e = table_containing(ptr, count);
    int device = e && sites[e->site].kind == KIND_DEVICE;
    pthread_mutex_unlock(&lock);
    if (device) {
      uintptr_t start = (uintptr_t)ptr, end = start + count;
      uintptr_t first = (start + page_bytes - 1) / page_bytes * page_bytes, last = end / page_bytes * page_bytes;
      if (last > first) {
        memset(ptr, 0, first - start);
        madvise((void *)first, last - first, MADV_DONTNEED);
        memset((void *)last, 0, end - last);
        return;
      }
    }
  }
  memset(ptr, value, count);
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  set(devPtr, value, count);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  set(devPtr, value, count);
  return cudaSuccess;
}

EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  if (!attributes) return fail(cudaErrorInvalidValue);
  memset(attributes, 0, sizeof *attributes);
  pthread_mutex_lock(&lock);
  entry_t *e = table_find(ptr);
  int kind = e ? sites[e->site].kind : -1;
  pthread_mutex_unlock(&lock);
  attributes->type = kind == KIND_DEVICE ? cudaMemoryTypeDevice
                     : kind == KIND_HOST ? cudaMemoryTypeHost
                                         : cudaMemoryTypeUnregistered;
  attributes->device = 0;
  attributes->devicePointer = kind >= 0 ? (void *)ptr : NULL;
  attributes->hostPointer = kind == KIND_HOST ? (void *)ptr : NULL;
  return cudaSuccess;
}

/* --- devices */

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count;
  return device_count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

EXPORT cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "digits-memplugin stand-in (no GPU)");
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = (char)(0xd1 + i + device);
  prop->totalGlobalMem = device_bytes;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->memPitch = 2147483647;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 65536;
  prop->major = 9;
  prop->minor = 0;
  prop->textureAlignment = 512;
  prop->texturePitchAlignment = 32;
  prop->multiProcessorCount = 132;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->pciBusID = 0x18 + device;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = 6144;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerMultiprocessor = 65536;
  prop->managedMemory = 1;
  prop->maxBlocksPerMultiProcessor = 32;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrClockRate: *value = 1980000; break;
    case cudaDevAttrMemoryClockRate: *value = 2619000; break;
    case cudaDevAttrGpuOverlap: *value = 1; break;
    case cudaDevAttrKernelExecTimeout: *value = 0; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    default: *value = 0;
  }
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
  (void)device;
  (void)peerDevice;
  if (canAccessPeer) *canAccessPeer = 0;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  (void)peerDevice;
  (void)flags;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
  (void)peerDevice;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
EXPORT cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  (void)flags;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion) {
  if (driverVersion) *driverVersion = CUDART_VERSION;
  return cudaSuccess;
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  if (runtimeVersion) *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

/* --- errors */

EXPORT cudaError_t cudaGetLastError(void) {
  cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }

EXPORT const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unknown error (digits-memplugin stand-in)";
  }
}

EXPORT const char *cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
  }
}

/* --- streams and events: handles that do nothing */

static void *new_handle(void) {
  void *handle = calloc(1, 16);
  if (!handle) abort();
  return handle;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  if (!pStream) return fail(cudaErrorInvalidValue);
  *pStream = new_handle();
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  return cudaStreamCreate(pStream);
}

EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
  (void)flags;
  (void)priority;
  return cudaStreamCreate(pStream);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  free(stream);
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)stream;
  (void)event;
  (void)flags;
  return cudaSuccess;
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event) {
  if (!event) return fail(cudaErrorInvalidValue);
  *event = new_handle();
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  return cudaEventCreate(event);
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  free(event);
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  (void)stream;
  if (event) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    *(double *)event = now.tv_sec * 1e3 + now.tv_nsec / 1e6;
  }
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  (void)event;
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  (void)event;
  return cudaSuccess;
}

EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return fail(cudaErrorInvalidValue);
  *ms = (float)(*(double *)end - *(double *)start);
  return cudaSuccess;
}

/* --- kernels: registered and launched as nvcc's host stubs ask, and run nowhere */

EXPORT void **__cudaRegisterFatBinary(void *fatCubin) {
  static void *handle;
  (void)fatCubin;
  return &handle;
}

EXPORT void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }
EXPORT void __cudaUnregisterFatBinary(void **fatCubinHandle) { (void)fatCubinHandle; }

EXPORT void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim,
                                   dim3 *gDim, int *wSize) {
  (void)fatCubinHandle; (void)hostFun; (void)deviceFun; (void)deviceName; (void)thread_limit;
  (void)tid; (void)bid; (void)bDim; (void)gDim; (void)wSize;
}

EXPORT void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress, const char *deviceName,
                              int ext, size_t size, int constant, int global) {
  (void)fatCubinHandle; (void)hostVar; (void)deviceAddress; (void)deviceName; (void)ext; (void)size;
  (void)constant; (void)global;
}

EXPORT void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress, char *deviceAddress,
                                     const char *deviceName, int ext, size_t size, int constant, int global) {
  (void)fatCubinHandle; (void)hostVarPtrAddress; (void)deviceAddress; (void)deviceName; (void)ext; (void)size;
  (void)constant; (void)global;
}

EXPORT char __cudaInitModule(void **fatCubinHandle) {
  (void)fatCubinHandle;
  return 1;
}

EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func) {
  if (kernel) *kernel = (cudaKernel_t)(uintptr_t)func;
  return cudaSuccess;
}

/* nvcc's stubs push the <<<grid, block, shared, stream>>> configuration, then pop it to launch. */
static __thread struct { dim3 grid, block; size_t shared; void *stream; } configuration;

EXPORT unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, struct CUstream_st *stream) {
  configuration.grid = gridDim;
  configuration.block = blockDim;
  configuration.shared = sharedMem;
  configuration.stream = stream;
  return 0;
}

EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream) {
  if (gridDim) *gridDim = configuration.grid;
  if (blockDim) *blockDim = configuration.block;
  if (sharedMem) *sharedMem = configuration.shared;
  if (stream) *(void **)stream = configuration.stream;
  return cudaSuccess;
}

static cudaError_t launch(void) {
  __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
  return cudaSuccess;
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                      size_t sharedMem, cudaStream_t stream) {
  (void)kernel; (void)gridDim; (void)blockDim; (void)args; (void)sharedMem; (void)stream;
  return launch();
}

EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                           size_t sharedMem, cudaStream_t stream) {
  (void)kernel; (void)gridDim; (void)blockDim; (void)args; (void)sharedMem; (void)stream;
  return launch();
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                    cudaStream_t stream) {
  (void)func; (void)gridDim; (void)blockDim; (void)args; (void)sharedMem; (void)stream;
  return launch();
}

EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
  (void)func;
  if (attr) {
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->binaryVersion = attr->ptxVersion = 90;
  }
  return cudaSuccess;
}

EXPORT cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  (void)func; (void)attr; (void)value;
  return cudaSuccess;
}

EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func,
                                                                          int blockSize, size_t dynamicSMemSize,
                                                                          unsigned int flags) {
  (void)func; (void)dynamicSMemSize; (void)flags;
  if (numBlocks) *numBlocks = blockSize > 0 ? 2048 / blockSize : 1;
  return cudaSuccess;
}
