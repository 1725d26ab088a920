/* The counting both memory counters share, included into each (one translation unit per library):
 *   cudart.c, the stand-in CUDA runtime (no GPU): it hands out host memory as device memory and counts it;
 *   probe.c, an LD_PRELOAD probe for a real GPU: it passes every call to the real runtime and counts the same way.
 *
 * Every device allocation and free is kept in a table by pointer and charged to its call site (the return address
 * of the call, resolved to a symbol when the report is written); the peak of live device bytes is tracked with the
 * sites' shares at that moment, and apart from the cuDNN convolutions' workspace. The report is JSON, written to
 * the file the includer's COUNTER_REPORT_ENV names, at exit and at every failed allocation (Caffe aborts right
 * after one). With DIGITS_MEMPLUGIN_LIVE naming a file, the live and peak device bytes are also kept there as two
 * little-endian 64-bit numbers, updated in place, for a monitor to read while the program runs.
 *
 * The includer defines COUNTER_REPORT_ENV, COUNTER_WHAT (what the figures are) and counter_extra (its own report
 * fields), defines _GNU_SOURCE before any header (dladdr), and includes standin.h. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_SITES 2048
#define MAX_FAILURES 16
#define MAX_SECTIONS 8

enum { KIND_DEVICE = 0, KIND_HOST = 1 };

/* One place in the program that allocates: the return address of its call. */
typedef struct {
  void *caller;
  int kind;
  int workspace; /* a cuDNN convolution's workspace (CuDNNConvolutionLayer::Reshape): reported apart */
  size_t allocations, frees, live, peak_live, live_at_peak, bytes_asked;
} site_t;

typedef struct {
  void *ptr; /* NULL: empty; TOMBSTONE: removed */
  size_t size, mapped;
  int site;
} entry_t;

typedef struct {
  size_t bytes, live;
  int site;
} failure_t;

#define TOMBSTONE ((void *)1)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *table;
static size_t table_capacity, table_used; /* used counts tombstones too */
static site_t sites[MAX_SITES];
static int site_count;
static size_t live_device, peak_device, live_nonworkspace, peak_nonworkspace, live_host, peak_host;
static size_t device_allocations, device_frees, host_allocations, host_frees;
static failure_t failures[MAX_FAILURES];
static size_t failure_count;
static struct { const char *name; standin_section_writer writer; } sections[MAX_SECTIONS];
static int section_count;
static volatile uint64_t *live_file; /* [live, peak], shared with a monitor */

static void counter_extra(FILE *out); /* the includer's own fields, each line ",\n  \"name\": value" */

/* --- the table: open addressing on the pointer */

static size_t slot_of(const void *ptr, size_t capacity) {
  uintptr_t h = (uintptr_t)ptr;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h & (capacity - 1);
}

static void table_insert(entry_t entry);

static void table_grow(void) {
  entry_t *old = table;
  size_t old_capacity = table_capacity;
  table_capacity = old_capacity ? old_capacity * 2 : 4096;
  table = calloc(table_capacity, sizeof(entry_t));
  if (!table) {
    fprintf(stderr, "digits-memplugin memory counter: out of host memory for its allocation table\n");
    abort();
  }
  table_used = 0;
  for (size_t i = 0; i < old_capacity; ++i)
    if (old[i].ptr && old[i].ptr != TOMBSTONE) table_insert(old[i]);
  free(old);
}

static void table_insert(entry_t entry) {
  if ((table_used + 1) * 2 > table_capacity) table_grow();
  size_t i = slot_of(entry.ptr, table_capacity);
  while (table[i].ptr && table[i].ptr != TOMBSTONE) i = (i + 1) & (table_capacity - 1);
  if (!table[i].ptr) ++table_used;
  table[i] = entry;
}

static entry_t *table_find(const void *ptr) {
  if (!table_capacity || !ptr) return NULL;
  size_t i = slot_of(ptr, table_capacity);
  while (table[i].ptr) {
    if (table[i].ptr == ptr) return &table[i];
    i = (i + 1) & (table_capacity - 1);
  }
  return NULL;
}

/* The device allocation holding [ptr, ptr + n), if any: a linear scan past the exact match (rare). */
__attribute__((unused)) static entry_t *table_containing(const void *ptr, size_t n) {
  const char *p = ptr;
  entry_t *hit = table_find(ptr);
  if (hit) return n <= hit->size ? hit : NULL;
  for (size_t i = 0; i < table_capacity; ++i) {
    entry_t *e = &table[i];
    if (!e->ptr || e->ptr == TOMBSTONE || sites[e->site].kind != KIND_DEVICE) continue;
    const char *base = e->ptr;
    if (p >= base && p + n <= base + e->size) return e;
  }
  return NULL;
}

/* --- call sites, counts and the peak (the lock held) */

static int is_workspace_symbol(const char *name) {
  /* caffe::CuDNNConvolutionLayer<Dtype>::Reshape, mangled: the one cudaMalloc of a cuDNN convolution's workspace */
  return name && strstr(name, "21CuDNNConvolutionLayer") && strstr(name, "7Reshape");
}

static int counter_site(void *caller, int kind) {
  for (int i = 0; i < site_count; ++i)
    if (sites[i].caller == caller && sites[i].kind == kind) return i;
  if (site_count == MAX_SITES) return MAX_SITES - 1; /* the last site takes the rest */
  site_t *s = &sites[site_count];
  memset(s, 0, sizeof *s);
  s->caller = caller;
  s->kind = kind;
  Dl_info info;
  if (kind == KIND_DEVICE && dladdr(caller, &info) && is_workspace_symbol(info.dli_sname)) s->workspace = 1;
  return site_count++;
}

static void counter_add(void *ptr, size_t size, size_t mapped, int site) {
  site_t *s = &sites[site];
  table_insert((entry_t){ptr, size, mapped, site});
  s->live += size;
  if (s->live > s->peak_live) s->peak_live = s->live;
  if (s->kind == KIND_HOST) {
    host_allocations++;
    live_host += size;
    if (live_host > peak_host) peak_host = live_host;
    return;
  }
  device_allocations++;
  live_device += size;
  if (!s->workspace) live_nonworkspace += size;
  if (live_device > peak_device) {
    peak_device = live_device;
    for (int i = 0; i < site_count; ++i) sites[i].live_at_peak = sites[i].live;
  }
  if (live_nonworkspace > peak_nonworkspace) peak_nonworkspace = live_nonworkspace;
  if (live_file) {
    live_file[0] = live_device;
    live_file[1] = peak_device;
  }
}

/* Forgets `ptr` (of `kind`); 0 when it was one, with its size and mapping. */
static int counter_remove(void *ptr, int kind, size_t *size, size_t *mapped) {
  entry_t *e = table_find(ptr);
  if (!e || sites[e->site].kind != kind) return -1;
  site_t *s = &sites[e->site];
  s->frees++;
  s->live -= e->size;
  if (kind == KIND_DEVICE) {
    live_device -= e->size;
    if (!s->workspace) live_nonworkspace -= e->size;
    device_frees++;
    if (live_file) live_file[0] = live_device;
  } else {
    live_host -= e->size;
    host_frees++;
  }
  *size = e->size;
  *mapped = e->mapped;
  e->ptr = TOMBSTONE;
  return 0;
}

static void counter_failure(size_t size, int site) {
  if (failure_count < MAX_FAILURES) failures[failure_count] = (failure_t){size, live_device, site};
  failure_count++;
}

/* --- the report */

EXPORT void digits_memplugin_standin_json_string(FILE *out, const char *text) {
  fputc('"', out);
  for (const unsigned char *c = (const unsigned char *)(text ? text : ""); *c; ++c) {
    if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
    else if (*c < 0x20) fprintf(out, "\\u%04x", *c);
    else fputc(*c, out);
  }
  fputc('"', out);
}

EXPORT void digits_memplugin_standin_add_section(const char *name, standin_section_writer writer) {
  pthread_mutex_lock(&lock);
  if (section_count < MAX_SECTIONS) {
    sections[section_count].name = name;
    sections[section_count].writer = writer;
    ++section_count;
  }
  pthread_mutex_unlock(&lock);
}

typedef char *(*demangler_t)(const char *, char *, size_t *, int *);

static void write_symbol(FILE *out, void *caller) {
  Dl_info info;
  const char *library = "?", *symbol = NULL;
  char *demangled = NULL;
  if (dladdr(caller, &info)) {
    library = info.dli_fname ? info.dli_fname : "?";
    symbol = info.dli_sname;
    /* libstdc++ is loaded by the C++ program calling us: demangle with its own demangler. */
    demangler_t demangle = (demangler_t)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    int status = -1;
    if (symbol && demangle) demangled = demangle(symbol, NULL, NULL, &status);
    if (status != 0) {
      free(demangled);
      demangled = NULL;
    }
  }
  const char *base = strrchr(library, '/');
  fputs("\"caller\": ", out);
  digits_memplugin_standin_json_string(out, demangled ? demangled : symbol ? symbol : "?");
  fputs(", \"symbol\": ", out);
  digits_memplugin_standin_json_string(out, symbol ? symbol : "?");
  fputs(", \"library\": ", out);
  digits_memplugin_standin_json_string(out, base ? base + 1 : library);
  free(demangled);
}

static void counter_write_report(const char *when) {
  const char *path = getenv(COUNTER_REPORT_ENV);
  if (!path || !*path) return;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fprintf(stderr, "digits-memplugin memory counter: cannot write its report to %s: %s\n", path, strerror(errno));
    return;
  }
  fputs("{\n  \"what\": ", out);
  digits_memplugin_standin_json_string(out, COUNTER_WHAT);
  fputs(",\n  \"written\": ", out);
  digits_memplugin_standin_json_string(out, when);
  fprintf(out,
          ",\n  \"pid\": %d,\n  \"peak_device_bytes\": %zu,\n  \"peak_device_bytes_without_workspace\": %zu,\n"
          "  \"live_device_bytes\": %zu,\n  \"device_allocations\": %zu,\n  \"device_frees\": %zu,\n"
          "  \"peak_host_pinned_bytes\": %zu,\n  \"live_host_pinned_bytes\": %zu,\n"
          "  \"host_pinned_allocations\": %zu,\n  \"host_pinned_frees\": %zu",
          (int)getpid(), peak_device, peak_nonworkspace, live_device, device_allocations, device_frees, peak_host,
          live_host, host_allocations, host_frees);
  counter_extra(out);
  fputs(",\n  \"failed_allocations\": [", out);
  for (size_t i = 0; i < failure_count && i < MAX_FAILURES; ++i) {
    fprintf(out, "%s\n    {\"bytes\": %zu, \"live_device_bytes\": %zu, ", i ? "," : "", failures[i].bytes,
            failures[i].live);
    write_symbol(out, sites[failures[i].site].caller);
    fputs("}", out);
  }
  fprintf(out, "%s],\n  \"failed_allocation_count\": %zu,\n  \"sites\": [", failure_count ? "\n  " : "",
          failure_count);
  for (int i = 0; i < site_count; ++i) {
    const site_t *s = &sites[i];
    fprintf(out,
            "%s\n    {\"kind\": \"%s\", \"workspace\": %s, \"allocations\": %zu, \"frees\": %zu, "
            "\"bytes_asked\": %zu, \"live\": %zu, \"peak_live\": %zu, \"live_at_peak\": %zu, ",
            i ? "," : "", s->kind == KIND_DEVICE ? "device" : "host_pinned", s->workspace ? "true" : "false",
            s->allocations, s->frees, s->bytes_asked, s->live, s->peak_live, s->live_at_peak);
    write_symbol(out, s->caller);
    fputs("}", out);
  }
  fputs("\n  ]", out);
  for (int i = 0; i < section_count; ++i) {
    fputs(",\n  ", out);
    digits_memplugin_standin_json_string(out, sections[i].name);
    fputs(": ", out);
    sections[i].writer(out);
  }
  fputs("\n}\n", out);
  if (fclose(out) != 0 || rename(tmp, path) != 0)
    fprintf(stderr, "digits-memplugin memory counter: cannot write its report to %s: %s\n", path, strerror(errno));
}

static void counter_write_report_at_exit(void) {
  pthread_mutex_lock(&lock);
  counter_write_report("exit");
  pthread_mutex_unlock(&lock);
}

/* Opens the live file (DIGITS_MEMPLUGIN_LIVE) and writes the report at exit. */
static void counter_init(void) {
  const char *live = getenv("DIGITS_MEMPLUGIN_LIVE");
  if (live && *live) {
    int fd = open(live, O_RDWR | O_CREAT, 0644); /* no O_TRUNC: the stand-in and the probe may share it */
    if (fd >= 0 && ftruncate(fd, 2 * sizeof(uint64_t)) == 0) {
      void *p = mmap(NULL, 2 * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) live_file = p;
    }
    if (fd >= 0) close(fd);
  }
  atexit(counter_write_report_at_exit);
}
