/* nccl_calls: call every probed NCCL function of a libnccl.so.2 N times, with known arguments.
 *
 *   nccl_calls LIBNCCL N
 *
 * Without a GPU, NVIDIA's library fails each call (no communicator is ever
 * created, so the collectives get a NULL comm), but every probe fires.  The
 * ncclUniqueId is filled here (bytes 0xa0, 0xa1, ...), not by
 * ncclGetUniqueId, which needs a network and may fail.  Each iteration:
 * ncclCommInitRank(nranks 4, rank 1), ncclCommInitRankConfig(4, 2),
 * ncclCommInitAll(2 devices), ncclCommSplit(color 3, key 5), ncclGroupStart,
 * the transfers below, ncclGroupEnd, ncclCommDestroy, ncclCommAbort.  Prints
 * "ok <pid>", then stays a second so the tracer reads its environment
 * (/proc/PID/environ) before it is gone.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *comm_t;
typedef int (*init_rank_t)(comm_t *, int, ncclUniqueId, int);
typedef int (*init_rank_config_t)(comm_t *, int, ncclUniqueId, int, void *);
typedef int (*init_all_t)(comm_t *, int, const int *);
typedef int (*split_t)(comm_t, int, int, comm_t *, void *);
typedef int (*all_reduce_t)(const void *, void *, size_t, int, int, comm_t, void *);
typedef int (*all_gather_t)(const void *, void *, size_t, int, comm_t, void *);
typedef int (*broadcast_t)(const void *, void *, size_t, int, int, comm_t, void *);
typedef int (*bcast_t)(void *, size_t, int, int, comm_t, void *);
typedef int (*reduce_t)(const void *, void *, size_t, int, int, int, comm_t, void *);
typedef int (*p2p_t)(void *, size_t, int, int, comm_t, void *);
typedef int (*none_t)(void);
typedef int (*comm_only_t)(comm_t);

static void *must(void *lib, const char *name)
{
	void *f = dlsym(lib, name);
	if (!f) {
		fprintf(stderr, "missing %s\n", name);
		exit(3);
	}
	return f;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 3;
	}
	long n = atol(argv[2]);
	init_rank_t init_rank = must(lib, "ncclCommInitRank");
	init_rank_config_t init_rank_config = must(lib, "ncclCommInitRankConfig");
	init_all_t init_all = must(lib, "ncclCommInitAll");
	split_t split = must(lib, "ncclCommSplit");
	all_reduce_t all_reduce = must(lib, "ncclAllReduce");
	all_reduce_t reduce_scatter = must(lib, "ncclReduceScatter");
	all_gather_t all_gather = must(lib, "ncclAllGather");
	broadcast_t broadcast = must(lib, "ncclBroadcast");
	bcast_t bcast = must(lib, "ncclBcast");
	reduce_t reduce = must(lib, "ncclReduce");
	p2p_t send = must(lib, "ncclSend");
	p2p_t recv = must(lib, "ncclRecv");
	none_t group_start = must(lib, "ncclGroupStart");
	none_t group_end = must(lib, "ncclGroupEnd");
	comm_only_t destroy = must(lib, "ncclCommDestroy");
	comm_only_t abort_ = must(lib, "ncclCommAbort");

	ncclUniqueId id;
	for (int i = 0; i < (int)sizeof(id.internal); i++)
		id.internal[i] = (char)(0xa0 + i);
	void *stream = (void *)0x5150;
	static char buf[1 << 16];
	for (long i = 0; i < n; i++) {
		comm_t comm = NULL, comm2 = NULL, newcomm = NULL, all[2] = {NULL, NULL};
		init_rank(&comm, 4, id, 1);
		init_rank_config(&comm2, 4, id, 2, NULL);
		init_all(all, 2, NULL);
		split(comm, 3, 5, &newcomm, NULL);
		group_start();
		all_reduce(buf, buf, 1000, 7 /* float32 */, 0 /* sum */, comm, stream);
		reduce_scatter(buf, buf, 100, 6 /* float16 */, 2 /* max */, comm, stream);
		all_gather(buf, buf, 300, 0 /* int8 */, comm, stream);
		broadcast(buf, buf, 50, 8 /* float64 */, 2, comm, stream);
		bcast(buf, 20, 5 /* uint64 */, 1, comm, stream);
		reduce(buf, buf, 10, 2 /* int32 */, 3 /* min */, 3, comm, stream);
		send(buf, 64, 1 /* uint8 */, 1, comm, stream);
		recv(buf, 32, 9 /* bfloat16 */, 0, comm, stream);
		group_end();
		destroy(newcomm);
		abort_(comm);
	}
	printf("ok %d\n", (int)getpid());
	fflush(stdout);
	/* alive while the tracer reads its environment (at its next flush of this pid's rows: a
	   second on a quiet box, more beside another traced test: 1 s was missed once) */
	sleep(3);
	return 0;
}
