/* fake_libnccl: a stand-in libnccl.so.2 whose calls succeed, with NCCL's signatures.
 *
 * Without a GPU NVIDIA's libnccl creates no communicator, so what the probes
 * read back at a return (the ncclComm_t an init or split wrote through its
 * out-pointer) and the comm a collective then passes are checked on this
 * one.  Every call returns ncclSuccess; the communicators are recognisable
 * numbers: ncclCommInitRank 0xc0ffee00 + rank, ncclCommInitRankConfig
 * 0xc0de0000 + rank, ncclCommInitAll 0xa1100000 + i, ncclCommSplit
 * 0x5b000000 + color (NULL for NCCL_SPLIT_NOCOLOR).
 * Build: cc -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl.so.2 fake_libnccl.c
 */
#include <stddef.h>
#include <stdint.h>

#define API __attribute__((visibility("default"), noinline))
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *comm_t;

API int ncclGetVersion(int *v) { *v = 22105; return 0; }
API int ncclCommInitRank(comm_t *c, int nranks, ncclUniqueId id, int rank)
{
	(void)nranks; (void)id;
	*c = (comm_t)(uintptr_t)(0xc0ffee00u + rank);
	return 0;
}
API int ncclCommInitRankConfig(comm_t *c, int nranks, ncclUniqueId id, int rank, void *config)
{
	(void)nranks; (void)id; (void)config;
	*c = (comm_t)(uintptr_t)(0xc0de0000u + rank);
	return 0;
}
API int ncclCommInitAll(comm_t *comms, int ndev, const int *devlist)
{
	(void)devlist;
	for (int i = 0; i < ndev; i++)
		comms[i] = (comm_t)(uintptr_t)(0xa1100000u + i);
	return 0;
}
API int ncclCommSplit(comm_t comm, int color, int key, comm_t *newcomm, void *config)
{
	(void)comm; (void)key; (void)config;
	*newcomm = color < 0 ? NULL : (comm_t)(uintptr_t)(0x5b000000u + color);
	return 0;
}
API int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, comm_t c, void *st)
{
	(void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st;
	return 0;
}
API int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, comm_t c, void *st)
{
	(void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st;
	return 0;
}
API int ncclAllGather(const void *s, void *r, size_t n, int t, comm_t c, void *st)
{
	(void)s; (void)r; (void)n; (void)t; (void)c; (void)st;
	return 0;
}
API int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, comm_t c, void *st)
{
	(void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st;
	return 0;
}
API int ncclBcast(void *b, size_t n, int t, int root, comm_t c, void *st)
{
	(void)b; (void)n; (void)t; (void)root; (void)c; (void)st;
	return 0;
}
API int ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, comm_t c, void *st)
{
	(void)s; (void)r; (void)n; (void)t; (void)op; (void)root; (void)c; (void)st;
	return 0;
}
API int ncclSend(const void *s, size_t n, int t, int peer, comm_t c, void *st)
{
	(void)s; (void)n; (void)t; (void)peer; (void)c; (void)st;
	return 0;
}
API int ncclRecv(void *r, size_t n, int t, int peer, comm_t c, void *st)
{
	(void)r; (void)n; (void)t; (void)peer; (void)c; (void)st;
	return 0;
}
API int ncclGroupStart(void) { return 0; }
API int ncclGroupEnd(void) { return 0; }
API int ncclCommDestroy(comm_t c) { (void)c; return 0; }
API int ncclCommAbort(comm_t c) { (void)c; return 0; }
