/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl.bpf.c - uprobes on NCCL (libnccl.so.2), included by ingero.bpf.c after
 * cuda.bpf.c, whose call state it shares: an NCCL call is a call like any
 * CUDA call (nesting, in_call of the thread's off-CPU intervals, the queued
 * bit through op_class).  ingero/collect/probes.py says which symbol
 * attaches to which entry; every NCCL symbol returns through nccl_return.
 *
 * What does not fit the call's own record (its comm, an init's rank, nranks
 * and ncclUniqueId) waits in nccl_calls (keyed by tid) from entry to return,
 * where it goes out as a struct ingero_nccl_ext claimed just before the
 * call's record.  NCCL calls are a few per training step, so the hash lookup
 * and the second record cost nothing that shows.
 *
 * Arguments follow the SysV x86-64 ABI as nccl.h declares them; the 128-byte
 * ncclUniqueId of ncclCommInitRank* is passed by value, in memory: at the
 * entry it starts at SP + 8 (stack slot 1), and the int arguments after it
 * still take the next free registers.
 */

/* ncclDataType_t -> bytes per element (ncclInt8 0 ... ncclBfloat16 9,
 * ncclFloat8e4m3 10, ncclFloat8e5m2 11); 0 for a type this table lacks, so
 * bytes are then 0 rather than a wrong count. */
static __always_inline u64 nccl_type_size(u64 dtype)
{
	switch (dtype) {
	case 0: case 1: case 10: case 11:
		return 1;
	case 6: case 9:
		return 2;
	case 2: case 3: case 7:
		return 4;
	case 4: case 5: case 8:
		return 8;
	default:
		return 0;
	}
}

/* events.h KIND_NCCL: redop and datatype packed in the record's kind byte. */
static __always_inline u8 nccl_kind(u64 redop, u64 dtype)
{
	u8 r = redop == NCCL_REDOP_NONE ? NCCL_REDOP_NONE : (u32)redop < NCCL_REDOP_CUSTOM ? (u8)redop : NCCL_REDOP_CUSTOM;
	u8 d = (u32)dtype < 12 ? (u8)dtype : NCCL_DTYPE_UNKNOWN;
	return KIND_NCCL | r << 4 | d;
}

/* Begin an NCCL call; nc (may be NULL) is kept until its return. */
static __always_inline int nccl_enter(struct pt_regs *ctx, u8 op, u8 kind, u64 bytes, u64 stream, struct nccl_call *nc)
{
	EMPTY_RETURN();
	u64 id = bpf_get_current_pid_tgid();
	struct call_state *s = call_begin(ctx, id, op, kind, bytes, stream, 0);
	if (!s)
		return 0;
	u32 tid = id;
	if (nc)
		nccl_call_put(&tid, nc);
	else
		nccl_call_del(&tid); /* a stale one, from a call whose return was never seen */
	s->ts = bpf_ktime_get_ns(); /* last: probe work is not call time */
	return 0;
}

static __always_inline int nccl_transfer(struct pt_regs *ctx, u8 op, u64 count, u64 dtype, u64 redop, s32 peer,
					 u64 comm, u64 stream)
{
	struct nccl_call nc = {.comm = comm, .peer = peer, .rank = -1, .nranks = -1, .color = -1};
	return nccl_enter(ctx, op, nccl_kind(redop, dtype), count * nccl_type_size(dtype), stream, &nc);
}

/* ncclAllReduce / ncclReduceScatter(sendbuff, recvbuff, count, datatype, op, comm, stream):
 * stream is stack slot 1. */
static __always_inline int on_nccl_all_reduce_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_ALL_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1,
			     PT_REGS_PARM6(ctx), user_u64(stack_arg_at(ctx, 1)));
}

static __always_inline int on_nccl_reduce_scatter_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_REDUCE_SCATTER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
			     -1, PT_REGS_PARM6(ctx), user_u64(stack_arg_at(ctx, 1)));
}

/* ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) */
static __always_inline int on_nccl_all_gather_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_ALL_GATHER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), NCCL_REDOP_NONE, -1,
			     PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream): stream is stack slot 1. */
static __always_inline int on_nccl_broadcast_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_BROADCAST, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), NCCL_REDOP_NONE,
			     (s32)PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), user_u64(stack_arg_at(ctx, 1)));
}

/* ncclBcast(buff, count, datatype, root, comm, stream): the in-place broadcast, stored as ncclBroadcast. */
static __always_inline int on_nccl_bcast_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_BROADCAST, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), NCCL_REDOP_NONE,
			     (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream):
 * comm and stream are stack slots 1 and 2. */
static __always_inline int on_nccl_reduce_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
			     (s32)PT_REGS_PARM6(ctx), user_u64(stack_arg_at(ctx, 1)), user_u64(stack_arg_at(ctx, 2)));
}

/* ncclSend / ncclRecv(buff, count, datatype, peer, comm, stream) */
static __always_inline int on_nccl_send_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_SEND, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), NCCL_REDOP_NONE,
			     (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

static __always_inline int on_nccl_recv_enter(struct pt_regs *ctx)
{
	return nccl_transfer(ctx, OP_NCCL_RECV, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), NCCL_REDOP_NONE,
			     (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

static __always_inline int on_nccl_group_start_enter(struct pt_regs *ctx)
{
	return nccl_enter(ctx, OP_NCCL_GROUP_START, KIND_NONE, 0, 0, 0);
}

static __always_inline int on_nccl_group_end_enter(struct pt_regs *ctx)
{
	return nccl_enter(ctx, OP_NCCL_GROUP_END, KIND_NONE, 0, 0, 0);
}

/* ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) and
 * ncclCommInitRankConfig(..., int rank, ncclConfig_t *config): commId is in
 * memory at SP + 8, rank in the third integer register. */
static __always_inline int nccl_init_rank(struct pt_regs *ctx, u8 op)
{
	struct nccl_call nc = {.out = PT_REGS_PARM1(ctx), .peer = -1, .nranks = (s32)PT_REGS_PARM2(ctx),
			       .rank = (s32)PT_REGS_PARM3(ctx), .color = -1};
	bpf_probe_read_user(&nc.id, sizeof(nc.id), (void *)stack_arg_at(ctx, 1));
	return nccl_enter(ctx, op, KIND_NONE, 0, 0, &nc);
}

static __always_inline int on_nccl_comm_init_rank_enter(struct pt_regs *ctx)
{
	return nccl_init_rank(ctx, OP_NCCL_COMM_INIT_RANK);
}

static __always_inline int on_nccl_comm_init_rank_config_enter(struct pt_regs *ctx)
{
	return nccl_init_rank(ctx, OP_NCCL_COMM_INIT_RANK_CONFIG);
}

/* ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist): one
 * process, ndev communicators, comms[i] is rank i; comms[0] is read back. */
static __always_inline int on_nccl_comm_init_all_enter(struct pt_regs *ctx)
{
	struct nccl_call nc = {.out = PT_REGS_PARM1(ctx), .peer = -1, .nranks = (s32)PT_REGS_PARM2(ctx), .rank = 0,
			       .color = -1};
	return nccl_enter(ctx, OP_NCCL_COMM_INIT_ALL, KIND_NONE, 0, 0, &nc);
}

/* ncclCommSplit(comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config):
 * ranks passing the same color (NCCL_SPLIT_NOCOLOR = -1: none) form one new
 * communicator, ordered by key; the new rank is known only to NCCL, so
 * parent and key go out for user space and the rank stays unknown. */
static __always_inline int on_nccl_comm_split_enter(struct pt_regs *ctx)
{
	struct nccl_call nc = {.out = PT_REGS_PARM4(ctx), .peer = -1, .rank = -1, .nranks = -1,
			       .color = (s32)PT_REGS_PARM2(ctx)};
	nc.id[0] = PT_REGS_PARM1(ctx);
	nc.id[1] = (u32)PT_REGS_PARM3(ctx);
	return nccl_enter(ctx, OP_NCCL_COMM_SPLIT, KIND_NONE, 0, 0, &nc);
}

/* ncclCommDestroy / ncclCommAbort(comm) */
static __always_inline int nccl_comm_only(struct pt_regs *ctx, u8 op)
{
	struct nccl_call nc = {.comm = PT_REGS_PARM1(ctx), .peer = -1, .rank = -1, .nranks = -1, .color = -1};
	return nccl_enter(ctx, op, KIND_NONE, 0, 0, &nc);
}

static __always_inline int on_nccl_comm_destroy_enter(struct pt_regs *ctx)
{
	return nccl_comm_only(ctx, OP_NCCL_COMM_DESTROY);
}

static __always_inline int on_nccl_comm_abort_enter(struct pt_regs *ctx)
{
	return nccl_comm_only(ctx, OP_NCCL_COMM_ABORT);
}

/* The return of every NCCL symbol: the extension record, then the call's. */
static __always_inline int on_nccl_return(struct pt_regs *ctx)
{
	EMPTY_RETURN();
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	struct call_state *s = call_end(id);
	if (!s)
		return 0;
	s32 ret = (s32)PT_REGS_RC(ctx);
	u32 tid = id;
	u32 peer = (u32)-1;
	struct nccl_call *nc = nccl_call_get(&tid);
	if (nc) {
		peer = (u32)nc->peer;
		struct ingero_nccl_ext *x = (struct ingero_nccl_ext *)event_reserve();
		if (x) {
			u64 comm = nc->comm;
			/* The created communicator is written on success, or with
			 * ncclInProgress (7) by a nonblocking init; after any
			 * other error the out-pointer holds whatever the caller
			 * left there. */
			if (nc->out)
				comm = (ret == 0 || ret == 7) ? user_u64(nc->out) : 0;
			x->ts_ns = s->ts;
			x->comm = comm;
			x->id[0] = nc->id[0];
			x->id[1] = nc->id[1];
			x->pid = id >> 32;
			x->tid = tid;
			x->rank = s->op == OP_NCCL_COMM_INIT_ALL && !comm ? -1 : nc->rank;
			x->nranks = nc->nranks;
			x->color = nc->color;
			x->op = OP_NCCL_EXT;
			x->call_op = s->op;
			x->cpu = bpf_get_smp_processor_id();
			event_submit((struct ingero_event *)x);
		}
		nccl_call_del(&tid);
	}
	call_record(s, now, id, ret, peer);
	return 0;
}
