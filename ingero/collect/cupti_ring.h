/* SPDX-License-Identifier: Apache-2.0
 *
 * cupti_ring.h - the shared-memory ring ingero's CUPTI injection library
 * (cupti_inject.c) writes and the tracer (collect/cupti.py) reads.
 *
 * One ring per traced process: a file "<pid>.ring" in the directory the
 * tracer names in INGERO_CUPTI_DIR, mapped shared by both.  A header page,
 * then `capacity` fixed-size records.  One writer (the process, under its
 * own lock), one reader (the tracer): the writer stores records, then
 * `head` (release); the reader loads `head`, copies the records up to it,
 * then stores `tail`.  A record the ring has no room for is counted in
 * `dropped`, never written over unread ones.
 *
 * Times are as CUPTI gives them (its own clock: CLOCK_REALTIME on Linux
 * unless a client registers another); CLOCK records pair that clock with
 * CLOCK_MONOTONIC (the clock of the tracer's BPF events), measured here.
 *
 * Fixed-width types only.  Mirrored once in Python (collect/cupti.py,
 * RING_HEADER_DTYPE and RECORD_DTYPE); tests/unit/test_cupti.py compiles a
 * program printing sizeof/offsetof and compares.
 */
#ifndef INGERO_CUPTI_RING_H
#define INGERO_CUPTI_RING_H

#include <stdint.h>

#define INGERO_CUPTI_MAGIC 0x4954505543474e49ull /* "INGCUPTI" little-endian */
#define INGERO_CUPTI_VERSION 1
#define INGERO_CUPTI_HEADER_BYTES 4096
#define INGERO_CUPTI_NOTE_BYTES 512
#define INGERO_CUPTI_NAME_PART 40 /* text bytes per NAME record */
#define INGERO_CUPTI_NAME_MAX 512 /* names are cut here */

enum ingero_cupti_rec_type {
	CUPTI_REC_CLOCK = 1,   /* start: CUPTI timestamp, end: CLOCK_MONOTONIC, bytes: the bracket (ns) */
	CUPTI_REC_KERNEL = 2,  /* name: the kernel's name id */
	CUPTI_REC_MEMCPY = 3,  /* kind: CUpti_ActivityMemcpyKind; src/dst: CUpti_ActivityMemoryKind */
	CUPTI_REC_MEMSET = 4,  /* src: CUpti_ActivityMemoryKind */
	CUPTI_REC_SYNC = 5,    /* kind: CUpti_ActivitySynchronizationType (a host wait, not device time) */
	CUPTI_REC_API = 6,     /* a runtime (kind 2) or driver (kind 1) call: tid, start, end; name: its api id */
	CUPTI_REC_NAME = 7,    /* struct ingero_cupti_name: part `kind` of the text of name id `name` */
	CUPTI_REC_DROPPED = 8, /* bytes: records CUPTI dropped (cuptiActivityGetNumDroppedRecords) */
};

/* 64 bytes.  name ids: a kernel's is its name's address (CUPTI keeps one string
 * per kernel); an API call's is (domain << 32) | cbid. */
struct ingero_cupti_rec {
	uint8_t type;
	uint8_t kind;
	uint8_t src;
	uint8_t dst;
	uint32_t device;
	uint64_t start;
	uint64_t end;
	uint64_t bytes;
	uint64_t name;
	uint32_t stream;
	uint32_t correlation;
	uint32_t tid;
	uint32_t context;
	uint32_t runtime_correlation; /* memcpy: CUPTI's runtimeCorrelationId (0: none) */
	uint32_t pad;
};

/* The same 64 bytes as a NAME record. */
struct ingero_cupti_name {
	uint8_t type;
	uint8_t part; /* 0, 1, ...: the text's INGERO_CUPTI_NAME_PART-byte pieces in order */
	uint8_t len;  /* bytes of text in this part */
	uint8_t last; /* 1: the last part */
	uint32_t pad;
	uint64_t id;
	uint64_t pad2;
	char text[INGERO_CUPTI_NAME_PART];
};

struct ingero_cupti_ring {
	uint64_t magic;
	uint32_t version;
	uint32_t rec_size;  /* sizeof(struct ingero_cupti_rec) */
	uint64_t capacity;  /* records, a power of two */
	uint32_t pid;
	uint32_t flags;     /* CUPTI_RING_* */
	uint64_t cupti_version;
	uint64_t pad0[3];
	uint64_t head;      /* records written (the writer's) */
	uint64_t pad1[7];
	uint64_t tail;      /* records read (the tracer's) */
	uint64_t pad2[7];
	uint64_t dropped;        /* records the ring had no room for */
	uint64_t cupti_records;  /* activity records CUPTI handed over */
	uint64_t buffers;        /* buffers CUPTI completed */
	uint64_t handled_ns;     /* CPU time (CLOCK_THREAD_CPUTIME_ID) spent turning them into ring records */
	uint64_t pad3[4];
	char note[INGERO_CUPTI_NOTE_BYTES]; /* what InitializeInjection did, or why it gave up: one line */
};

enum {
	CUPTI_RING_READY = 1,   /* CUPTI records are enabled */
	CUPTI_RING_FAILED = 2,  /* set up failed: see note */
	CUPTI_RING_CLOSED = 4,  /* the process flushed at exit: nothing more will come */
};

#endif
