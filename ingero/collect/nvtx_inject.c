/* SPDX-License-Identifier: Apache-2.0
 *
 * nvtx_inject.c - ingero's NVTX injection library.
 *
 * NVTX3 is header-only: every nvtxRangePushA, nvtx.annotate or
 * torch.cuda.nvtx.range_push goes through a function table in the
 * application that stays empty (each call a no-op) unless the process loads
 * an injection library, named by NVTX_INJECTION64_PATH, whose exported
 * InitializeInjectionNvtx2 fills the table.  `ingero trace --cmd` builds this
 * file (ingero/collect/nvtx_inject.py) and sets that variable for the
 * command.
 *
 * The table entries below only decode their arguments and call one of four
 * ingero_nvtx_* functions, which do nothing: their entries are what
 * bpf/nvtx.bpf.c uprobes, each reading at most one `const char *` and one
 * integer from registers.  No state is kept here beyond a per-thread depth
 * (the level NVTX's push and pop return) and a process-wide range id counter;
 * pairing pushes with pops is done by the collector (ingero/collect/nvtx.py).
 *
 * The ABI follows nvtx3/nvtxDetail/nvtxTypes.h and nvToolsExt.h (NVTX API
 * version 3): types are declared here, so building needs no CUDA headers.
 * Wide-character (W) variants are left unset (each stays a no-op): no
 * framework ingero knows of calls them.  Marks, category and thread names,
 * resources and the sync, CUDA and OpenCL modules are left unset too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
/* Probed: kept out of line and never folded away, whatever the optimiser
 * proves about an empty body (the asm says the arguments are used). */
#define PROBED __attribute__((visibility("default"), noinline, used))

/* --- the NVTX ABI (nvtxTypes.h, nvToolsExt.h) ------------------------------ */

typedef void (*nvtx_fn)(void);
typedef nvtx_fn **nvtx_table;               /* [cbid] -> where the application keeps that function */
typedef const void *(*nvtx_get_export_table)(uint32_t id);

enum { NVTX_ETID_CALLBACKS = 1 };
enum { NVTX_CB_MODULE_CORE = 1, NVTX_CB_MODULE_CORE2 = 5 };
enum {                                       /* NvtxCallbackIdCore */
	CORE_RANGE_START_EX = 4,
	CORE_RANGE_START_A = 5,
	CORE_RANGE_END = 7,
	CORE_RANGE_PUSH_EX = 8,
	CORE_RANGE_PUSH_A = 9,
	CORE_RANGE_POP = 11,
};
enum {                                       /* NvtxCallbackIdCore2 */
	CORE2_DOMAIN_RANGE_START_EX = 2,
	CORE2_DOMAIN_RANGE_END = 3,
	CORE2_DOMAIN_RANGE_PUSH_EX = 4,
	CORE2_DOMAIN_RANGE_POP = 5,
	CORE2_DOMAIN_REGISTER_STRING_A = 10,
	CORE2_DOMAIN_CREATE_A = 12,
	CORE2_DOMAIN_DESTROY = 14,
};

struct nvtx_callbacks {                      /* NvtxExportTableCallbacks */
	size_t struct_size;
	int (*get_module_function_table)(int module, nvtx_table *out_table, unsigned int *out_size);
};

enum { NVTX_MESSAGE_TYPE_ASCII = 1, NVTX_MESSAGE_TYPE_REGISTERED = 3 };

struct nvtx_event_attributes {               /* nvtxEventAttributes_v2: 48 bytes */
	uint16_t version;
	uint16_t size;
	uint32_t category;
	int32_t color_type;
	uint32_t color;
	int32_t payload_type;
	int32_t reserved0;
	uint64_t payload;
	int32_t message_type;
	const char *message;                 /* ascii, or a registered handle (below) */
};

/* --- what bpf/nvtx.bpf.c probes ------------------------------------------- */

/* domain: the domain handle (0: the default domain, nvtxRangePush*). */
PROBED void ingero_nvtx_push(const char *message, uintptr_t domain)
{
	__asm__ volatile("" : : "r"(message), "r"(domain) : "memory");
}

PROBED void ingero_nvtx_pop(uintptr_t domain)
{
	__asm__ volatile("" : : "r"(domain) : "memory");
}

PROBED void ingero_nvtx_start(const char *message, uint64_t id)
{
	__asm__ volatile("" : : "r"(message), "r"(id) : "memory");
}

PROBED void ingero_nvtx_end(uint64_t id)
{
	__asm__ volatile("" : : "r"(id) : "memory");
}

/* --- the table entries ----------------------------------------------------- */

/* The thread's push depth, across domains: push returns the new range's
 * 0-based level and pop the ended one's, as NVTX specifies; a pop with
 * nothing pushed returns -1 (NVTX's error value) and is not reported. */
static __thread int depth;
static uint64_t next_id; /* nvtxRangeId_t: unique in the process, never 0 */

/* The message of an event's attributes: ASCII as is; a registered string's
 * handle is the copy DomainRegisterStringA made, so it reads the same way;
 * any other kind (unicode, none): no message. */
static const char *message_of(const struct nvtx_event_attributes *a)
{
	if (!a || a->size < sizeof(*a))
		return 0;
	if (a->message_type == NVTX_MESSAGE_TYPE_ASCII || a->message_type == NVTX_MESSAGE_TYPE_REGISTERED)
		return a->message;
	return 0;
}

/* The probe reads the message with bpf_probe_read_user_str, which cannot
 * fault a page in: a string literal nothing has read yet (a C program's
 * nvtxRangePushA("step") on a .rodata page never touched) reads as nothing.
 * So its bytes, as many as ingero keeps (NVTX_TEXT_MAX, bpf/events.h), are
 * read here first. */
static void touch(const char *message)
{
	if (message) {
		size_t n = strnlen(message, 65); /* NVTX_TEXT_MAX and its NUL, as the probe reads */
		__asm__ volatile("" : : "r"(n));
	}
}

static int push(const char *message, uintptr_t domain)
{
	touch(message);
	ingero_nvtx_push(message, domain);
	return depth++;
}

static int pop(uintptr_t domain)
{
	if (depth <= 0)
		return -1;
	ingero_nvtx_pop(domain);
	return --depth;
}

static uint64_t start(const char *message)
{
	uint64_t id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
	touch(message);
	ingero_nvtx_start(message, id);
	return id;
}

static int range_push_a(const char *message) { return push(message, 0); }
static int range_push_ex(const struct nvtx_event_attributes *a) { return push(message_of(a), 0); }
static int range_pop(void) { return pop(0); }
static uint64_t range_start_a(const char *message) { return start(message); }
static uint64_t range_start_ex(const struct nvtx_event_attributes *a) { return start(message_of(a)); }
static void range_end(uint64_t id) { ingero_nvtx_end(id); }

static int domain_range_push_ex(void *domain, const struct nvtx_event_attributes *a)
{
	return push(message_of(a), (uintptr_t)domain);
}
static int domain_range_pop(void *domain) { return pop((uintptr_t)domain); }
static uint64_t domain_range_start_ex(void *domain, const struct nvtx_event_attributes *a)
{
	(void)domain;
	return start(message_of(a));
}
static void domain_range_end(void *domain, uint64_t id)
{
	(void)domain;
	ingero_nvtx_end(id);
}

/* A domain handle must be non-NULL for NVTX clients to treat the domain as
 * enabled (NVIDIA's Python nvtx package drops every range of a NULL one): the
 * handle is a copy of the name.  Registered strings (that package registers
 * every message) are copies of the string, so the probe reads them as it
 * reads an ASCII message.  Both live as long as the process: NVTX has no way
 * to unregister a string, and a destroyed domain's handle may still be
 * compared by a range in flight, so DomainDestroy frees nothing. */
static void *domain_create_a(const char *name) { return strdup(name ? name : ""); }
static void *domain_register_string_a(void *domain, const char *s)
{
	(void)domain;
	return strdup(s ? s : "");
}
static void domain_destroy(void *domain) { (void)domain; }

static void set(nvtx_table table, unsigned int size, unsigned int cbid, nvtx_fn fn)
{
	if (cbid < size && table[cbid])
		*table[cbid] = fn;
}

EXPORT int InitializeInjectionNvtx2(nvtx_get_export_table get_export_table)
{
	const struct nvtx_callbacks *cb = get_export_table(NVTX_ETID_CALLBACKS);
	if (!cb || cb->struct_size < sizeof(*cb) || !cb->get_module_function_table)
		return 0; /* 0: NVTX stays off in this process, as without an injection */
	nvtx_table t;
	unsigned int n;
	if (cb->get_module_function_table(NVTX_CB_MODULE_CORE, &t, &n) && t) {
		set(t, n, CORE_RANGE_PUSH_A, (nvtx_fn)range_push_a);
		set(t, n, CORE_RANGE_PUSH_EX, (nvtx_fn)range_push_ex);
		set(t, n, CORE_RANGE_POP, (nvtx_fn)range_pop);
		set(t, n, CORE_RANGE_START_A, (nvtx_fn)range_start_a);
		set(t, n, CORE_RANGE_START_EX, (nvtx_fn)range_start_ex);
		set(t, n, CORE_RANGE_END, (nvtx_fn)range_end);
	}
	if (cb->get_module_function_table(NVTX_CB_MODULE_CORE2, &t, &n) && t) {
		set(t, n, CORE2_DOMAIN_RANGE_PUSH_EX, (nvtx_fn)domain_range_push_ex);
		set(t, n, CORE2_DOMAIN_RANGE_POP, (nvtx_fn)domain_range_pop);
		set(t, n, CORE2_DOMAIN_RANGE_START_EX, (nvtx_fn)domain_range_start_ex);
		set(t, n, CORE2_DOMAIN_RANGE_END, (nvtx_fn)domain_range_end);
		set(t, n, CORE2_DOMAIN_CREATE_A, (nvtx_fn)domain_create_a);
		set(t, n, CORE2_DOMAIN_REGISTER_STRING_A, (nvtx_fn)domain_register_string_a);
		set(t, n, CORE2_DOMAIN_DESTROY, (nvtx_fn)domain_destroy);
	}
	return 1;
}
