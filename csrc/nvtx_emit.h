/* NVTX emission primitives for the hot path (csrc/types.c) and the Python bindings.
 *
 * All functions are no-ops (returning 0/NULL) when built without INSTRUMENT_HAVE_NVTX.
 * Without a tool attached, NVTX itself turns every call into a null-pointer check.
 *
 * Threading: push/pop/start/end/register/color may be called from any thread.
 * nvtx_emit_init changes the process-wide domain; call it (under the GIL) before
 * emitting. Handles from nvtx_emit_register belong to the domain current at the
 * time; after a re-init with another name nvtx_emit_generation() changes and
 * cached handles must be registered again.
 */
#ifndef INSTRUMENT_NVTX_EMIT_H
#define INSTRUMENT_NVTX_EMIT_H

#include <stddef.h>
#include <stdint.h>

#define NVTX_EMIT_DEFAULT_DOMAIN "instrument"

int      nvtx_emit_init(const char *domain_name);        /* create the domain once (same name: no-op); returns 0 */
uint32_t nvtx_emit_generation(void);                     /* bumped whenever the domain changes */
const char *nvtx_emit_domain_name(void);                 /* current domain name ("" before init) */
void    *nvtx_emit_register(const char *message);        /* registered-string handle in the current domain */
uint32_t nvtx_emit_color(const char *name, size_t len);  /* FNV-1a 32 of the bytes into a fixed ARGB palette */
void     nvtx_emit_name_category(uint32_t category, const char *name);
void     nvtx_emit_push(void *registered, uint32_t color, uint32_t category);
void     nvtx_emit_pop(void);
uint64_t nvtx_emit_start(void *registered, uint32_t color, uint32_t category);
void     nvtx_emit_end(uint64_t id);
int      nvtx_emit_available(void);                      /* 1 when compiled with the NVTX headers */
int      nvtx_emit_active(void);                         /* 1 when a tool is attached (else every call is a no-op) */

#ifdef Py_PYTHON_H
/* Adds nvtx_init, nvtx_domain, nvtx_color, nvtx_push, nvtx_pop, nvtx_range_start, nvtx_range_end,
 * nvtx_name_category and nvtx_available to module m. Returns 0, or -1 with an exception set. */
int nvtx_add_functions(PyObject *m);
#endif

#endif
