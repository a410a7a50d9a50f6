/* A minimal NVTX injection library that records calls, for tests.
 *
 * Load it with NVTX_INJECTION64_PATH=<this .so>; every NVTX copy in the process (our
 * extension, each of the nvtx package's Cython modules) calls InitializeInjectionNvtx2
 * once and gets its CORE/CORE2 slots filled with the recording functions below.
 *
 * Each call appends one line to $NVTX_RECORD_PATH (stderr if unset, nothing if "none"),
 * flushed immediately:
 *   tid \t call \t domain \t message \t color \t category \t id
 * tid is the kernel thread id (threading.get_native_id()); call is the NVTX API name;
 * domain is "" for the default domain; message is resolved from registered handles;
 * color is 8 hex digits or "" when not ARGB; id is the range id for start/end, the
 * depth for push/pop, "" otherwise. Tabs, newlines and backslashes are escaped.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <wchar.h>

#define NVTX_NO_IMPL /* a tool: types and declarations only */
#include <nvtx3/nvToolsExt.h>

struct nvtxDomainRegistration_st { char *name; struct nvtxDomainRegistration_st *next; };
struct nvtxStringRegistration_st { struct nvtxDomainRegistration_st *domain; char *text; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static struct nvtxDomainRegistration_st *domains; /* one handle per name, shared by all NVTX copies */
static uint64_t next_range_id = 1;
static __thread int depth;

static void put_escaped(const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\t') fputs("\\t", out);
        else if (*s == '\n') fputs("\\n", out);
        else if (*s == '\\') fputs("\\\\", out);
        else fputc(*s, out);
    }
}

/* Caller holds the lock. */
static void emit(const char *call, nvtxDomainHandle_t d, const char *message, int has_color,
                 uint32_t color, uint32_t category, int has_id, uint64_t id)
{
    if (!out) return;
    fprintf(out, "%ld\t%s\t", (long)syscall(SYS_gettid), call);
    put_escaped(d ? d->name : "");
    fputc('\t', out);
    put_escaped(message);
    fputc('\t', out);
    if (has_color) fprintf(out, "%08X", color);
    fprintf(out, "\t%u\t", category);
    if (has_id) fprintf(out, "%llu", (unsigned long long)id);
    fputc('\n', out);
    fflush(out);
}

static char *wide_to_utf8(const wchar_t *w)
{
    size_t n = w ? wcslen(w) : 0;
    char *s = malloc(4 * n + 1), *p = s;
    for (size_t i = 0; s && i < n; i++) *p++ = (w[i] > 0 && w[i] < 0x80) ? (char)w[i] : '?'; /* ASCII is enough here */
    if (s) *p = 0;
    return s;
}

/* Message text of an attribute struct; *tmp is set when it had to be allocated. */
static const char *message_of(const nvtxEventAttributes_t *a, char **tmp)
{
    *tmp = NULL;
    if (!a) return "";
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return a->message.ascii ? a->message.ascii : "";
    case NVTX_MESSAGE_TYPE_UNICODE: return (*tmp = wide_to_utf8(a->message.unicode)) ? *tmp : "";
    case NVTX_MESSAGE_TYPE_REGISTERED: return a->message.registered ? a->message.registered->text : "";
    default: return "";
    }
}

static void emit_attr(const char *call, nvtxDomainHandle_t d, const nvtxEventAttributes_t *a, int has_id, uint64_t id)
{
    char *tmp;
    const char *msg = message_of(a, &tmp);
    emit(call, d, msg, a && a->colorType == NVTX_COLOR_ARGB, a ? a->color : 0, a ? a->category : 0, has_id, id);
    free(tmp);
}

/* ---- CORE2 (domain) API ---- */

static nvtxDomainHandle_t NVTX_API rec_DomainCreateA(const char *name)
{
    pthread_mutex_lock(&lock);
    struct nvtxDomainRegistration_st *d = domains;
    while (d && strcmp(d->name, name ? name : "") != 0) d = d->next;
    if (!d && (d = calloc(1, sizeof *d))) {
        d->name = strdup(name ? name : "");
        d->next = domains;
        domains = d;
    }
    emit("nvtxDomainCreateA", d, name, 0, 0, 0, 0, 0);
    pthread_mutex_unlock(&lock);
    return d;
}

static void NVTX_API rec_DomainDestroy(nvtxDomainHandle_t d)
{
    pthread_mutex_lock(&lock); /* handles are shared by name, so they stay allocated */
    emit("nvtxDomainDestroy", d, "", 0, 0, 0, 0, 0);
    pthread_mutex_unlock(&lock);
}

static nvtxStringHandle_t NVTX_API rec_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s)
{
    struct nvtxStringRegistration_st *r = calloc(1, sizeof *r);
    if (r) {
        r->domain = d;
        r->text = strdup(s ? s : "");
    }
    pthread_mutex_lock(&lock);
    emit("nvtxDomainRegisterStringA", d, s, 0, 0, 0, 0, 0);
    pthread_mutex_unlock(&lock);
    return r;
}

static nvtxStringHandle_t NVTX_API rec_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t *w)
{
    char *s = wide_to_utf8(w);
    nvtxStringHandle_t r = rec_DomainRegisterStringA(d, s);
    free(s);
    return r;
}

static void NVTX_API rec_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t category, const char *name)
{
    pthread_mutex_lock(&lock);
    emit(d ? "nvtxDomainNameCategoryA" : "nvtxNameCategoryA", d, name, 0, 0, category, 0, 0);
    pthread_mutex_unlock(&lock);
}

static void NVTX_API rec_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    pthread_mutex_lock(&lock);
    emit_attr(d ? "nvtxDomainMarkEx" : "nvtxMarkEx", d, a, 0, 0);
    pthread_mutex_unlock(&lock);
}

static int NVTX_API rec_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    int level = depth++;
    pthread_mutex_lock(&lock);
    emit_attr(d ? "nvtxDomainRangePushEx" : "nvtxRangePushEx", d, a, 1, (uint64_t)level);
    pthread_mutex_unlock(&lock);
    return level;
}

static int NVTX_API rec_DomainRangePop(nvtxDomainHandle_t d)
{
    int level = depth > 0 ? --depth : -1;
    pthread_mutex_lock(&lock);
    emit(d ? "nvtxDomainRangePop" : "nvtxRangePop", d, "", 0, 0, 0, level >= 0, (uint64_t)level);
    pthread_mutex_unlock(&lock);
    return level;
}

static nvtxRangeId_t NVTX_API rec_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    pthread_mutex_lock(&lock);
    nvtxRangeId_t id = next_range_id++;
    emit_attr(d ? "nvtxDomainRangeStartEx" : "nvtxRangeStartEx", d, a, 1, id);
    pthread_mutex_unlock(&lock);
    return id;
}

static void NVTX_API rec_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id)
{
    pthread_mutex_lock(&lock);
    emit(d ? "nvtxDomainRangeEnd" : "nvtxRangeEnd", d, "", 0, 0, 0, 1, id);
    pthread_mutex_unlock(&lock);
}

static void NVTX_API rec_Initialize(const void *reserved) {}

/* ---- CORE (default domain) API: same recorders with a NULL domain ---- */

static nvtxEventAttributes_t ascii_attr(const char *message)
{
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;
    return a;
}

static void NVTX_API rec_MarkEx(const nvtxEventAttributes_t *a) { rec_DomainMarkEx(NULL, a); }
static void NVTX_API rec_MarkA(const char *m)
{
    nvtxEventAttributes_t a = ascii_attr(m);
    pthread_mutex_lock(&lock);
    emit_attr("nvtxMarkA", NULL, &a, 0, 0);
    pthread_mutex_unlock(&lock);
}
static nvtxRangeId_t NVTX_API rec_RangeStartEx(const nvtxEventAttributes_t *a) { return rec_DomainRangeStartEx(NULL, a); }
static nvtxRangeId_t NVTX_API rec_RangeStartA(const char *m)
{
    nvtxEventAttributes_t a = ascii_attr(m);
    return rec_DomainRangeStartEx(NULL, &a);
}
static void NVTX_API rec_RangeEnd(nvtxRangeId_t id) { rec_DomainRangeEnd(NULL, id); }
static int NVTX_API rec_RangePushEx(const nvtxEventAttributes_t *a) { return rec_DomainRangePushEx(NULL, a); }
static int NVTX_API rec_RangePushA(const char *m)
{
    nvtxEventAttributes_t a = ascii_attr(m);
    return rec_DomainRangePushEx(NULL, &a);
}
static int NVTX_API rec_RangePop(void) { return rec_DomainRangePop(NULL); }
static void NVTX_API rec_NameCategoryA(uint32_t category, const char *name) { rec_DomainNameCategoryA(NULL, category, name); }
static void NVTX_API rec_NameOsThreadA(uint32_t tid, const char *name)
{
    pthread_mutex_lock(&lock);
    emit("nvtxNameOsThreadA", NULL, name, 0, 0, 0, 1, tid);
    pthread_mutex_unlock(&lock);
}

/* ---- attach ---- */

typedef struct { unsigned int id; NvtxFunctionPointer fn; } slot_t;
#define SLOT(prefix, name) {prefix##name, (NvtxFunctionPointer)rec_##name}

static const slot_t core_slots[] = {
    SLOT(NVTX_CBID_CORE_, MarkEx), SLOT(NVTX_CBID_CORE_, MarkA), SLOT(NVTX_CBID_CORE_, RangeStartEx),
    SLOT(NVTX_CBID_CORE_, RangeStartA), SLOT(NVTX_CBID_CORE_, RangeEnd), SLOT(NVTX_CBID_CORE_, RangePushEx),
    SLOT(NVTX_CBID_CORE_, RangePushA), SLOT(NVTX_CBID_CORE_, RangePop), SLOT(NVTX_CBID_CORE_, NameCategoryA),
    SLOT(NVTX_CBID_CORE_, NameOsThreadA),
};
static const slot_t core2_slots[] = {
    SLOT(NVTX_CBID_CORE2_, DomainMarkEx), SLOT(NVTX_CBID_CORE2_, DomainRangeStartEx),
    SLOT(NVTX_CBID_CORE2_, DomainRangeEnd), SLOT(NVTX_CBID_CORE2_, DomainRangePushEx),
    SLOT(NVTX_CBID_CORE2_, DomainRangePop), SLOT(NVTX_CBID_CORE2_, DomainNameCategoryA),
    SLOT(NVTX_CBID_CORE2_, DomainRegisterStringA), SLOT(NVTX_CBID_CORE2_, DomainRegisterStringW),
    SLOT(NVTX_CBID_CORE2_, DomainCreateA), SLOT(NVTX_CBID_CORE2_, DomainDestroy),
    SLOT(NVTX_CBID_CORE2_, Initialize),
};

static int fill(const NvtxExportTableCallbacks *cb, NvtxCallbackModule module, const slot_t *slots, size_t n)
{
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!cb->GetModuleFunctionTable(module, &table, &size) || !table) return 0;
    for (size_t i = 0; i < n; i++)
        if (slots[i].id < size && table[slots[i].id]) *table[slots[i].id] = slots[i].fn;
    return 1;
}

static void open_output(void)
{
    const char *path = getenv("NVTX_RECORD_PATH");
    if (path && strcmp(path, "none") == 0) return; /* attached but silent: for overhead measurements */
    out = fopen(path && *path ? path : "/dev/stderr", "a");
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, open_output);
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)getExportTable(NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb) return 0; /* 0 tells this NVTX copy to detach */
    const NvtxExportTableVersionInfo *vi = (const NvtxExportTableVersionInfo *)getExportTable(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->SetInjectionNvtxVersion) vi->SetInjectionNvtxVersion(NVTX_VERSION);
    return fill(cb, NVTX_CB_MODULE_CORE, core_slots, sizeof core_slots / sizeof core_slots[0]) &&
           fill(cb, NVTX_CB_MODULE_CORE2, core2_slots, sizeof core2_slots / sizeof core2_slots[0]);
}
