/* SPDX-License-Identifier: Apache-2.0
 *
 * simnccl.c - a simulated NCCL (libnccl.so.2) for machines without a GPU.
 *
 * NVIDIA's names, C signatures and SONAME, so ingero's uprobes and their
 * argument decoding are real; the transport is modelled.  Collectives really
 * rendezvous across the rank processes, through shared memory keyed by the
 * ncclUniqueId (POSIX shm "/simnccl-<hex of the id>"), and a futex:
 *
 *   - each rank entering collective k of a communicator publishes when its
 *     part could start: max(its entry time, the end of the work already on
 *     its stream) - an atomic max into the collective's slot;
 *   - the last rank to enter writes the collective's start (the maximum) and
 *     bumps the slot's sequence word, a futex it wakes;
 *   - every rank's call queues the collective's device work on its own stream
 *     of the simulated CUDA runtime (simcudaEnqueueGated, demos/simcuda) and
 *     returns at once, as NCCL's enqueue does: the work starts when the gate
 *     opens, no earlier than the start the last rank wrote, and lasts
 *     bytes / SIMNCCL_GBPS (ring algorithm volumes, below) + SIMNCCL_LAT_US.
 *
 * So a rank's cudaStreamSynchronize after a collective waits until the last
 * rank has entered it and the transfer is done, under the runtime's wait
 * policy (spin / yield / block, SIMCUDA_SCHEDULE): a late rank makes every
 * other rank wait, as with real NCCL.  Send / recv pairs rendezvous the same
 * way on a per-(sender, receiver) channel.  Group calls (ncclGroupStart/End)
 * need nothing more: no call blocks on the host.
 *
 * Bytes moved per rank (NCCL's ring algorithms; B = count x datatype size):
 *   AllReduce 2(n-1)/n B; AllGather, ReduceScatter (n-1) B (B per rank);
 *   Broadcast, Reduce, Send/Recv B.
 *
 * Truth for tests (not in NVIDIA's library): simncclWaitNs(comm) sums, over
 * this rank's completed collectives, how long its part stood waiting for the
 * others (start - its own ready time); simncclLastCount(comm) counts the
 * collectives it entered last; simncclCollectives(comm) counts its
 * collectives.
 *
 * Knobs (environment, read at the first call):
 *   SIMNCCL_GBPS    bus bandwidth per rank (25; NVLink-class links move more,
 *                   PCIe ~12)
 *   SIMNCCL_LAT_US  fixed cost per collective (20; NCCL's small-message
 *                   latency within a node is ~10-30 us)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *cudaStream_t;

/* From the simulated CUDA runtime (libcudart.so.12, demos/simcuda). */
extern int simcudaEnqueueGated(cudaStream_t stream, const volatile uint32_t *word, uint32_t value,
			       const volatile uint64_t *start_ns, uint64_t dur_ns);
extern uint64_t simcudaStreamTailNs(cudaStream_t stream);

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclNumResults = 8
} ncclResult_t;

typedef enum {
	ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
	ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
	ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11, ncclNumTypes = 12
} ncclDataType_t;

typedef int ncclRedOp_t; /* ncclSum 0, ncclProd 1, ncclMax 2, ncclMin 3, ncclAvg 4 */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Opaque to callers; the first fields of NCCL's ncclConfig_t. */
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
} ncclConfig_t;

#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_VERSION_CODE 22105 /* 2.21.5, the nvidia-nccl-cu12 wheel's */

/* ---- shared state ---------------------------------------------------------- */

#define MAX_RANKS 16
#define NSLOTS 64
#define ID_MAGIC 0x53494d4e43434cull /* "SIMNCCL" */
#define NS_PER_US 1000ull

/* One rendezvous point in a ring of NSLOTS: collective (or p2p transfer) k
 * uses slot k % NSLOTS.  Ranks cannot run NSLOTS rendezvous ahead of each
 * other: a rank's next call on a stream places the previous one first. */
struct slot {
	_Atomic uint64_t ready_max; /* max over arrived ranks of their ready time */
	_Atomic uint32_t arrived;
	volatile uint32_t seq;      /* futex word: k + 1 once rendezvous k is complete */
	volatile uint64_t start_ns; /* the rendezvous' start, valid once seq says so */
	uint64_t entered_ns[MAX_RANKS];
};

struct channel {
	struct slot slot[NSLOTS];
};

struct shared {
	_Atomic uint32_t nranks; /* set by the first rank to arrive */
	_Atomic uint32_t joined; /* futex word while ranks join */
	_Atomic uint32_t left;
	uint32_t pad;
	struct channel coll;                        /* every collective of the comm */
	struct channel p2p[MAX_RANKS][MAX_RANKS];   /* [sender][receiver] */
};

struct pending {
	uint32_t slot, seq; /* waiting for slot's seq to reach seq */
	uint64_t ready_ns;
};

struct ncclComm {
	uint64_t magic;
	struct shared *sh;
	char shm_name[64];
	int rank, nranks;
	uint32_t coll_seq;                /* this rank's collectives so far */
	uint32_t send_seq[MAX_RANKS];     /* sends to each peer */
	uint32_t recv_seq[MAX_RANKS];     /* receives from each peer */
	struct pending pend[NSLOTS];      /* this rank's collectives not yet accounted */
	unsigned n_pend;
	uint64_t wait_ns, last_count, collectives;
	ncclResult_t async_error;
};
typedef struct ncclComm *ncclComm_t;
#define COMM_MAGIC 0x434f4d4d53494dull

static double gbps = 25.0;
static uint64_t lat_ns = 20 * NS_PER_US;
static int knobs_read;
static __thread int group_depth;
static ncclResult_t last_error;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void read_knobs(void)
{
	if (knobs_read)
		return;
	const char *g = getenv("SIMNCCL_GBPS"), *l = getenv("SIMNCCL_LAT_US");
	if (g && atof(g) > 0)
		gbps = atof(g);
	if (l && *l)
		lat_ns = (uint64_t)strtoull(l, NULL, 10) * NS_PER_US;
	knobs_read = 1;
}

static ncclResult_t fail(ncclResult_t r)
{
	last_error = r;
	return r;
}

static void futex_wake(volatile void *addr)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static void futex_wait(volatile void *addr, uint32_t seen)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static int datatype_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	default: return 0;
	}
}

static struct ncclComm *comm_of(ncclComm_t c)
{
	return c && c->magic == COMM_MAGIC ? c : NULL;
}

/* ---- unique ids and communicators -------------------------------------------- */

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
	if (!uniqueId)
		return fail(ncclInvalidArgument);
	memset(uniqueId, 0, sizeof(*uniqueId));
	uint64_t w[2] = {ID_MAGIC, 0};
	if (getrandom(&w[1], sizeof(w[1]), 0) != sizeof(w[1]))
		w[1] = now_ns() ^ ((uint64_t)getpid() << 32);
	memcpy(uniqueId->internal, w, sizeof(w));
	return ncclSuccess;
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return fail(ncclInvalidArgument);
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank)
{
	read_knobs();
	if (!out)
		return fail(ncclInvalidArgument);
	*out = NULL;
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
		return fail(ncclInvalidArgument);
	uint64_t w[2];
	memcpy(w, id->internal, sizeof(w));
	if (w[0] != ID_MAGIC)
		return fail(ncclInvalidArgument); /* not from ncclGetUniqueId */
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (!c)
		return fail(ncclSystemError);
	snprintf(c->shm_name, sizeof(c->shm_name), "/simnccl-%016llx", (unsigned long long)w[1]);
	int fd = shm_open(c->shm_name, O_RDWR | O_CREAT, 0600);
	if (fd < 0 || ftruncate(fd, sizeof(struct shared)) != 0) {
		if (fd >= 0)
			close(fd);
		free(c);
		return fail(ncclSystemError);
	}
	/* zero-filled by ftruncate: every field's initial state is zero */
	c->sh = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (c->sh == MAP_FAILED) {
		free(c);
		return fail(ncclSystemError);
	}
	uint32_t expect = 0;
	if (!__atomic_compare_exchange_n((uint32_t *)&c->sh->nranks, &expect, (uint32_t)nranks, 0,
					 __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) && expect != (uint32_t)nranks) {
		munmap(c->sh, sizeof(struct shared));
		free(c);
		return fail(ncclInvalidArgument); /* ranks disagree on the size */
	}
	c->magic = COMM_MAGIC;
	c->rank = rank;
	c->nranks = nranks;
	/* like NCCL's bootstrap: returns once every rank has joined */
	uint32_t n = __atomic_add_fetch((uint32_t *)&c->sh->joined, 1, __ATOMIC_SEQ_CST);
	if (n >= (uint32_t)nranks)
		futex_wake(&c->sh->joined);
	while ((n = __atomic_load_n((uint32_t *)&c->sh->joined, __ATOMIC_SEQ_CST)) < (uint32_t)nranks)
		futex_wait(&c->sh->joined, n);
	*out = c;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	return init_rank(comm, nranks, &commId, rank);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
					   ncclConfig_t *config)
{
	(void)config;
	return init_rank(comm, nranks, &commId, rank);
}

/* One process, ndev devices: the simulated runtime has one device. */
EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	(void)devlist;
	if (!comm || ndev != 1)
		return fail(ncclInvalidArgument);
	ncclUniqueId id;
	ncclGetUniqueId(&id);
	return init_rank(comm, 1, &id, 0);
}

/* Splitting needs NCCL's own agreement on colors across ranks: not modelled. */
EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	(void)key, (void)config;
	if (!comm_of(comm) || !newcomm)
		return fail(ncclInvalidArgument);
	*newcomm = NULL;
	return color == NCCL_SPLIT_NOCOLOR ? ncclSuccess : fail(ncclInvalidUsage);
}

static ncclResult_t release(ncclComm_t comm)
{
	struct ncclComm *c = comm_of(comm);
	if (!c)
		return fail(ncclInvalidArgument);
	uint32_t left = __atomic_add_fetch((uint32_t *)&c->sh->left, 1, __ATOMIC_SEQ_CST);
	if (left == (uint32_t)c->nranks)
		shm_unlink(c->shm_name); /* the last rank out removes the segment */
	munmap(c->sh, sizeof(struct shared));
	c->magic = 0;
	free(c);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	return comm_of(comm) ? ncclSuccess : fail(ncclInvalidArgument);
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	return release(comm);
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	return release(comm);
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	struct ncclComm *c = comm_of(comm);
	if (!c || !count)
		return fail(ncclInvalidArgument);
	*count = c->nranks;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	struct ncclComm *c = comm_of(comm);
	if (!c || !rank)
		return fail(ncclInvalidArgument);
	*rank = c->rank;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	if (!comm_of(comm) || !device)
		return fail(ncclInvalidArgument);
	*device = 0;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	struct ncclComm *c = comm_of(comm);
	if (!c || !asyncError)
		return fail(ncclInvalidArgument);
	*asyncError = c->async_error;
	return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
	(void)comm;
	return last_error == ncclSuccess ? "" : ncclGetErrorString(last_error);
}

EXPORT ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
	if (group_depth <= 0)
		return fail(ncclInvalidUsage);
	group_depth--;
	return ncclSuccess;
}

/* ---- the rendezvous ------------------------------------------------------------ */

/* Account the collectives whose start is now known: how long this rank's
 * part waited for the others. */
static void settle(struct ncclComm *c)
{
	unsigned keep = 0;
	for (unsigned i = 0; i < c->n_pend; i++) {
		struct pending *p = &c->pend[i];
		struct slot *s = &c->sh->coll.slot[p->slot];
		if ((int32_t)(s->seq - p->seq) >= 0) {
			uint64_t start = s->start_ns;
			c->wait_ns += start > p->ready_ns ? start - p->ready_ns : 0;
		} else {
			c->pend[keep++] = *p;
		}
	}
	c->n_pend = keep;
}

/* Enter rendezvous k (0-based) of channel ch with `parties` participants and
 * queue its device work (dur_ns) on the stream, gated on its completion. */
static ncclResult_t rendezvous(struct ncclComm *c, struct channel *ch, uint32_t k, uint32_t parties,
			       int me, cudaStream_t stream, uint64_t dur_ns, int collective)
{
	uint64_t entered = now_ns(), tail = simcudaStreamTailNs(stream);
	uint64_t ready = entered > tail ? entered : tail;
	struct slot *s = &ch->slot[k % NSLOTS];
	s->entered_ns[me] = entered;
	uint64_t cur = __atomic_load_n((uint64_t *)&s->ready_max, __ATOMIC_SEQ_CST);
	while (cur < ready &&
	       !__atomic_compare_exchange_n((uint64_t *)&s->ready_max, &cur, ready, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		;
	uint32_t n = __atomic_add_fetch((uint32_t *)&s->arrived, 1, __ATOMIC_SEQ_CST);
	if (n == parties) {
		/* the last one in: every ready time is in; start, reset the slot for k + NSLOTS, open */
		s->start_ns = __atomic_load_n((uint64_t *)&s->ready_max, __ATOMIC_SEQ_CST);
		__atomic_store_n((uint64_t *)&s->ready_max, 0, __ATOMIC_SEQ_CST);
		__atomic_store_n((uint32_t *)&s->arrived, 0, __ATOMIC_SEQ_CST);
		__atomic_store_n((uint32_t *)&s->seq, k + 1, __ATOMIC_SEQ_CST);
		futex_wake(&s->seq);
		if (collective)
			c->last_count++;
	}
	if (collective) {
		if (c->n_pend == NSLOTS)
			settle(c);
		if (c->n_pend < NSLOTS)
			c->pend[c->n_pend++] = (struct pending){k % NSLOTS, k + 1, ready};
		c->collectives++;
	}
	if (simcudaEnqueueGated(stream, &s->seq, k + 1, &s->start_ns, dur_ns) != 0)
		return fail(ncclUnhandledCudaError);
	return ncclSuccess;
}

static uint64_t transfer_ns(double bytes)
{
	return lat_ns + (uint64_t)(bytes / gbps);
}

static ncclResult_t collective(ncclComm_t comm, size_t count, ncclDataType_t dt, double volume, cudaStream_t stream)
{
	struct ncclComm *c = comm_of(comm);
	int size = datatype_size(dt);
	if (!c || !size)
		return fail(ncclInvalidArgument);
	settle(c);
	double bytes = (double)count * size * volume;
	return rendezvous(c, &c->sh->coll, c->coll_seq++, (uint32_t)c->nranks, c->rank, stream, transfer_ns(bytes), 1);
}

static double ring(struct ncclComm *c, double per_step)
{
	return c ? per_step * (c->nranks - 1) : 0;
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)op;
	struct ncclComm *c = comm_of(comm);
	return collective(comm, count, datatype, c ? 2.0 * (c->nranks - 1) / c->nranks : 0, stream);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
				  ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff;
	return collective(comm, sendcount, datatype, ring(comm_of(comm), 1.0), stream);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
				      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)op;
	return collective(comm, recvcount, datatype, ring(comm_of(comm), 1.0), stream);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				  int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff;
	struct ncclComm *c = comm_of(comm);
	if (c && (root < 0 || root >= c->nranks))
		return fail(ncclInvalidArgument);
	return collective(comm, count, datatype, 1.0, stream);
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
			      cudaStream_t stream)
{
	return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)op;
	struct ncclComm *c = comm_of(comm);
	if (c && (root < 0 || root >= c->nranks))
		return fail(ncclInvalidArgument);
	return collective(comm, count, datatype, 1.0, stream);
}

static ncclResult_t p2p(ncclComm_t comm, size_t count, ncclDataType_t dt, int peer, cudaStream_t stream, int send)
{
	struct ncclComm *c = comm_of(comm);
	int size = datatype_size(dt);
	if (!c || !size || peer < 0 || peer >= c->nranks)
		return fail(ncclInvalidArgument);
	int from = send ? c->rank : peer, to = send ? peer : c->rank;
	uint32_t k = send ? c->send_seq[peer]++ : c->recv_seq[peer]++;
	/* sender is party 0, receiver party 1 of the (from, to) channel */
	return rendezvous(c, &c->sh->p2p[from][to], k, from == to ? 1 : 2, send ? 0 : 1, stream,
			  transfer_ns((double)count * size), 0);
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
			     ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff;
	return p2p(comm, count, datatype, peer, stream, 1);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
			     cudaStream_t stream)
{
	(void)recvbuff;
	return p2p(comm, count, datatype, peer, stream, 0);
}

/* ---- truth for tests (not in NVIDIA's library) ------------------------------ */

/* ns this rank's completed collectives stood waiting for the other ranks. */
EXPORT uint64_t simncclWaitNs(ncclComm_t comm)
{
	struct ncclComm *c = comm_of(comm);
	if (!c)
		return 0;
	settle(c);
	return c->wait_ns;
}

/* Collectives this rank entered last (it completed the rendezvous). */
EXPORT uint64_t simncclLastCount(ncclComm_t comm)
{
	struct ncclComm *c = comm_of(comm);
	return c ? c->last_count : 0;
}

EXPORT uint64_t simncclCollectives(ncclComm_t comm)
{
	struct ncclComm *c = comm_of(comm);
	return c ? c->collectives : 0;
}
