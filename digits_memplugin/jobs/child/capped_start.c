/* The start of a capped `caffe train`: preloaded (LD_PRELOAD) into the binary by the training child
 * (digits_memplugin/jobs/child/binary_runner.py; built by jobs/preload.py with the machine's C compiler).
 *
 * Why: the pycaffe runner warms OpenBLAS up in its own process before it sets RLIMIT_DATA (jobs/blas_warmup.py):
 * OpenBLAS maps a 128 MiB work buffer the first time a call takes its buffered path, and under RLIMIT_DATA a map that
 * fails is retried for ever (blas_memory_alloc), so no buffer may be left for after the cap. A binary cannot be
 * asked to do that, so this library does it inside it, at the one moment that is right for it: it defines
 * __libc_start_main, which the executable's _start calls through its PLT once the dynamic loader has loaded and
 * initialised every shared library (OpenBLAS's own constructor, Caffe's layer registry) and before caffe's main
 * runs. There it
 *
 *   - calls each BLAS routine Caffe's float math uses (sgemm in all four transpositions, sgemv both ways, saxpy,
 *     sscal, sdot, sasum), found as Caffe finds them (the global scope), at sizes past every kernel's
 *     small-matrix path and into the threaded ones, in rounds, reading VmData around each, until a round maps
 *     nothing more (the same calls and sizes as blas_warmup.py; operands in mappings of their own, unmapped after,
 *     so that malloc's mmap threshold is left alone);
 *   - makes the threads caffe starts from now on reserve MEMPLUGIN_THREAD_STACK bytes of stack (pthread default);
 *   - measures VmData and malloc's heap (mallinfo2: uordblks + hblkhd) as the baseline and sets RLIMIT_DATA to the
 *     baseline plus MEMPLUGIN_DATA_CAP;
 *   - names MEMPLUGIN_PTRACER the process that may ptrace it (Yama), for the watchdog's gdb;
 *   - writes one JSON line saying all that to the descriptor MEMPLUGIN_REPORT_FD and closes it;
 *   - starts a thread that answers each byte read from MEMPLUGIN_QUERY_FD with a line "<heap bytes>\n" on
 *     MEMPLUGIN_ANSWER_FD: the runner's figure of Caffe's own allocation (malloc's heap can only be read from
 *     inside); it ends when the runner closes its end.
 *
 * If the cap cannot be set, caffe does not start: the report says why and the process exits with status 70.
 * MEMPLUGIN_WARM_UP=0 leaves the BLAS cold (the tests' witness that the warm-up is what keeps a capped caffe from
 * hanging).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
#define GEMM_SIZE 512
#define GEMV_SIZE 1024
#define VECTOR_SIZE (1 << 20)
#define MAX_ROUNDS 4
#define ANSWER_THREAD_STACK (256 * 1024)
#define EXIT_NOT_CAPPED 70

typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
typedef void (*sgemv_t)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
typedef void (*saxpy_t)(int, float, const float *, int, float *, int);
typedef void (*sscal_t)(int, float, float *, int);
typedef float (*sdot_t)(int, const float *, int, const float *, int);
typedef float (*sasum_t)(int, const float *, int);
typedef char *(*corename_t)(void);
typedef int (*threads_t)(void);
typedef int (*start_main_t)(int (*)(int, char **, char **), int, char **, void (*)(void), void (*)(void),
                            void (*)(void), void *);

static int query_fd = -1, answer_fd = -1;

/* VmData of this process in bytes, from /proc/self/status (read without malloc); -1 when it cannot be read. */
static long long data_bytes(void) {
    char buffer[8192];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t length = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    if (length <= 0) return -1;
    buffer[length] = '\0';
    const char *line = strstr(buffer, "\nVmData:");
    if (line == NULL) return -1;
    return strtoll(line + 8, NULL, 10) * 1024;
}

static long long heap_bytes(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 info = mallinfo2();
    return (long long)(info.uordblks + info.hblkhd);
#else
    struct mallinfo info = mallinfo();
    return (long long)(unsigned)info.uordblks + (long long)(unsigned)info.hblkhd;
#endif
}

static long long env_number(const char *name, long long fallback) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') return fallback;
    return strtoll(value, NULL, 10);
}

struct operands {
    void *maps[5];
    size_t sizes[5];
    int used;
};

static float *operand(struct operands *all, size_t count) {
    void *map = mmap(NULL, count * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    all->maps[all->used] = map;
    all->sizes[all->used++] = count * sizeof(float);
    return (float *)map;
}

/* Writes `text` as a JSON string (quoted, escaped) into `out` of `size` bytes. */
static void json_string(char *out, size_t size, const char *text) {
    size_t at = 0;
    if (text == NULL) {
        snprintf(out, size, "null");
        return;
    }
    out[at++] = '"';
    for (; *text && at + 8 < size; ++text) {
        unsigned char c = (unsigned char)*text;
        if (c == '"' || c == '\\') {
            out[at++] = '\\';
            out[at++] = (char)c;
        } else if (c < 0x20) {
            at += (size_t)snprintf(out + at, size - at, "\\u%04x", c);
        } else {
            out[at++] = (char)c;
        }
    }
    out[at++] = '"';
    out[at] = '\0';
}

static void *answer_queries(void *unused) {
    (void)unused;
    char request;
    for (;;) {
        ssize_t got = read(query_fd, &request, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got != 1) break;
        char line[32];
        int length = snprintf(line, sizeof line, "%lld\n", heap_bytes());
        if (write(answer_fd, line, (size_t)length) != length) break;
    }
    close(query_fd);
    close(answer_fd);
    return NULL;
}

static void prepare(void) {
    int report_fd = (int)env_number("MEMPLUGIN_REPORT_FD", -1);
    if (report_fd < 0) return; /* not started by the runner: nothing to do */
    /* Only a process that has Caffe's BLAS is Caffe: a wrapper script's shell (build/tools/caffe may be one) passes
       the environment on untouched to the caffe it starts. */
    sgemm_t sgemm = (sgemm_t)dlsym(RTLD_DEFAULT, "cblas_sgemm");
    if (sgemm == NULL) return;
    long long ptracer = env_number("MEMPLUGIN_PTRACER", 0);
    if (ptracer > 0) prctl(PR_SET_PTRACER, (unsigned long)ptracer, 0, 0, 0);

    /* The BLAS Caffe calls, as its own calls resolve them. */
    sgemv_t sgemv = (sgemv_t)dlsym(RTLD_DEFAULT, "cblas_sgemv");
    saxpy_t saxpy = (saxpy_t)dlsym(RTLD_DEFAULT, "cblas_saxpy");
    sscal_t sscal = (sscal_t)dlsym(RTLD_DEFAULT, "cblas_sscal");
    sdot_t sdot = (sdot_t)dlsym(RTLD_DEFAULT, "cblas_sdot");
    sasum_t sasum = (sasum_t)dlsym(RTLD_DEFAULT, "cblas_sasum");
    corename_t corename = (corename_t)dlsym(RTLD_DEFAULT, "openblas_get_corename");
    threads_t threads = (threads_t)dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
    const char *library = NULL;
    Dl_info info;
    if (dladdr((void *)sgemm, &info) && info.dli_fname != NULL) library = info.dli_fname;

    long long before = data_bytes();
    int rounds = 0, settled = 0;
    if (env_number("MEMPLUGIN_WARM_UP", 1) != 0) {
        struct operands all = {.used = 0};
        const int n = GEMM_SIZE, m = GEMV_SIZE;
        float *square = operand(&all, (size_t)n * n), *result = operand(&all, (size_t)n * n);
        float *matrix = operand(&all, (size_t)m * m);
        float *vector = operand(&all, VECTOR_SIZE), *other = operand(&all, VECTOR_SIZE);
        if (all.used == 5) {
            while (rounds < MAX_ROUNDS && !settled) {
                long long start = data_bytes();
                for (int a = 0; a < 2; ++a)
                    for (int b = 0; b < 2; ++b)
                        sgemm(ROW_MAJOR, a ? TRANS : NO_TRANS, b ? TRANS : NO_TRANS, n, n, n, 1.0f, square, n, square,
                              n, 0.0f, result, n);
                if (sgemv != NULL) {
                    sgemv(ROW_MAJOR, NO_TRANS, m, m, 1.0f, matrix, m, vector, 1, 0.0f, other, 1);
                    sgemv(ROW_MAJOR, TRANS, m, m, 1.0f, matrix, m, vector, 1, 0.0f, other, 1);
                }
                if (saxpy != NULL) saxpy(VECTOR_SIZE, 1.0f, vector, 1, other, 1);
                if (sscal != NULL) sscal(VECTOR_SIZE, 1.0f, other, 1);
                if (sdot != NULL) (void)sdot(VECTOR_SIZE, vector, 1, other, 1);
                if (sasum != NULL) (void)sasum(VECTOR_SIZE, vector, 1);
                ++rounds;
                settled = rounds > 1 && data_bytes() == start;
            }
        }
        for (int i = 0; i < all.used; ++i) munmap(all.maps[i], all.sizes[i]);
    }
    long long warmed = data_bytes();

    long long stack = env_number("MEMPLUGIN_THREAD_STACK", 0);
    if (stack > 0) {
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) == 0) {
            if (pthread_attr_setstacksize(&attr, (size_t)stack) == 0) pthread_setattr_default_np(&attr);
            pthread_attr_destroy(&attr);
        }
    }

    query_fd = (int)env_number("MEMPLUGIN_QUERY_FD", -1);
    answer_fd = (int)env_number("MEMPLUGIN_ANSWER_FD", -1);
    int answering = 0;
    if (query_fd >= 0 && answer_fd >= 0) {
        pthread_attr_t attr;
        pthread_t thread;
        /* A small stack of its own; where the libraries' thread-local storage needs more, the default one. */
        if (pthread_attr_init(&attr) == 0) {
            if (pthread_attr_setstacksize(&attr, ANSWER_THREAD_STACK) == 0)
                answering = pthread_create(&thread, &attr, answer_queries, NULL) == 0;
            pthread_attr_destroy(&attr);
        }
        if (!answering) answering = pthread_create(&thread, NULL, answer_queries, NULL) == 0;
        if (answering) pthread_detach(thread);
    }

    long long baseline = data_bytes(), heap = heap_bytes();
    long long cap = env_number("MEMPLUGIN_DATA_CAP", 0);
    const char *error = NULL;
    char error_text[160];
    if (cap > 0) {
        if (baseline < 0) {
            error = "VmData cannot be read from /proc/self/status";
        } else {
            struct rlimit limit = {(rlim_t)(baseline + cap), (rlim_t)(baseline + cap)};
            if (setrlimit(RLIMIT_DATA, &limit) != 0) {
                snprintf(error_text, sizeof error_text, "setrlimit(RLIMIT_DATA) failed: %s", strerror(errno));
                error = error_text;
            }
        }
    }

    char library_json[1024], core_json[128], error_json[400], line[2048];
    json_string(library_json, sizeof library_json, library);
    json_string(core_json, sizeof core_json, corename != NULL ? corename() : NULL);
    json_string(error_json, sizeof error_json, error);
    int length = snprintf(
        line, sizeof line,
        "{\"pid\": %ld, \"library\": %s, \"core\": %s, \"threads\": %d, \"mapped_bytes\": %lld, \"rounds\": %d, "
        "\"settled\": %s, \"baseline_bytes\": %lld, \"heap_bytes\": %lld, \"memory_cap\": %lld, \"answering\": %s, "
        "\"error\": %s}\n",
        (long)getpid(), library_json, core_json, threads != NULL ? threads() : -1,
        before >= 0 && warmed >= 0 ? warmed - before : 0, rounds, settled ? "true" : "false", baseline, heap,
        cap, answering ? "true" : "false", error_json);
    if (length > 0) (void)!write(report_fd, line, (size_t)length);
    close(report_fd);
    if (error != NULL) _exit(EXIT_NOT_CAPPED);
}

int __libc_start_main(int (*main)(int, char **, char **), int argc, char **argv, void (*init)(void),
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
    start_main_t real = (start_main_t)dlsym(RTLD_NEXT, "__libc_start_main");
    prepare();
    return real(main, argc, argv, init, fini, rtld_fini, stack_end);
}
