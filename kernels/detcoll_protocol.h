// detcoll_protocol.h — the collective, fused-tree and copy kernel bodies of detcoll, for CUDA
// and HIP. The entry files (detcoll_cuda.cu, detcoll_hip.hip) only add the `extern "C"`
// kernels and the ABI table around these bodies, so both platforms run the same protocol code.
//
// One kernel launch per collective call runs the protocol of collective-core/src/protocol:
//
//   g = own generation counter + 1, frame f = g % 2 (double-buffered, so no "done" flag)
//   stage:   block b copies its tiles of this rank's input into its own frame f
//   publish: sig slot f = full signature; release ready[b] = g << 32 | digest
//   wait:    acquire every peer's ready[b]; Ready/Passed go on, Mismatch/Corrupt/timeout record
//            an error in host-mapped memory and end the call
//   phase 1: the tree over every rank's frame f, read in rank order (or gather copies)
//   phase 2: (all_reduce RS+AG only) release phase2[b], acquire peers' phase2[b], gather their
//            reduced shards (a fused norm launch skips the segments flagged DC_SEG_NORM_READ:
//            its norm reads those shards in place, detcoll_norm.h)
//   the last block to finish stores the counter = g, so graph replays advance with no host.
//
// Block <-> element mapping. Frame bytes are cut into tiles of `tile_bytes`; tile t belongs to
// block t % grid in every phase and on every rank (grid is a function of the signature and the
// configuration, equal on all ranks). So whatever the segments of a plan, the frame bytes block
// b reads from a peer after seeing the peer's ready[b] are exactly the bytes the peer's block b
// staged before publishing it: per-block flags suffice.
//
// The execution model is reached only through these macros, which the entry file defines
// before including this header (CUDA: the built-in variables and intrinsics, unchanged; HIP:
// amdgcn builtins, because the HIP entry is compiled without the HIP headers):
//
//   DC_TID, DC_BID, DC_NTID, DC_NBLOCKS   thread/block index, threads per block, blocks
//   DC_SYNC_BLOCK()                        block barrier with block-scope memory ordering
//   DC_FENCE_SYSTEM()                      sequentially consistent fence, system scope
//   DC_FENCE_RELEASE_SYSTEM()              release fence, system scope (a release pattern with
//                                          relaxed stores after it)
//   DC_ATOMIC_CAS_U64(p, cmp, val)         device-scope CAS on a dc_u64, returns the old value
//   DC_ATOMIC_ADD_U32(p, v)                device-scope add on the dc_u32 at p, returns the old
//   DC_SHARED, DC_DEV_NOINLINE             block-shared storage; an out-of-line device function
//   DC_GRID_DEP_WAIT(), DC_GRID_DEP_TRIGGER()
//                                          programmatic dependent launch: wait for the grids this
//                                          launch depends on; let dependent launches start (no-ops
//                                          where the platform has none)
//
// Like detcoll_tree.h, this header has no includes: NVRTC compiles it without a toolkit on
// disk, and clang compiles the HIP entry with -nogpuinc.
#ifndef DETCOLL_PROTOCOL_H
#define DETCOLL_PROTOCOL_H

#include "detcoll_tree.h"

// Bumped whenever the parameter layout or the protocol changes; checked by the host against
// `detcoll_abi` so a stale prebuilt cubin is refused instead of misread. 7: worlds 3, 5, 6 and 7
// (a version-6 image would run them as 8 ranks). 8: the residual + RMSNorm entry
// (`detcoll_residual_rmsnorm`, DcNormParams; a version-7 image lacks it). 9: the fused
// all_reduce + residual + RMSNorm entry (`detcoll_collective_norm`, DcCollectiveNormParams).
// 10: the table's last word is the image's world set (DC_WORLDS), so an image built for some
// worlds only is never taken for one of every world (a launch for a missing world traps).
// 11: the header's tile_bytes may be 16 KiB (the wide tile of fused rows of 8192 on bulk push
// and RS+AG); a version-10 image would walk half the LL lines in such a call's epoch refresh.
// 12: the wide tile also carries two f16/bf16 rows of 4096 (the row forms' pairs); a version-11
// image would take such a call's gathered-sum form in the collective's grid only.
#define DC_ABI_VERSION 12u

#define DC_MAX_WORLD 8

// The world sizes this image instantiates: bit w for world w (default: every world 1..8, what
// prebuilt images and the HIP build carry). A process compiling at run time builds only the
// worlds it launches (`-DDC_WORLDS=...`, crates/cuda-ipc/src/kernels.rs): every world is its own
// unrolled instantiation of every reduction body, and NVRTC's time grows with each. The host
// picks the image by world — the set is the last word of `detcoll_abi`, so a prebuilt image
// built for some worlds only is taken only for those — and no launch names a world its image
// lacks; a kernel that was sent one anyway traps (DC_UNSUPPORTED_WORLD) instead of returning
// without writing the output.
#ifndef DC_WORLDS
#define DC_WORLDS 0x1FEu
#endif
#define DC_HAS_WORLD(w) (((DC_WORLDS) >> (w)) & 1u)
#if DC_HAS_WORLD(1)
#define DC_IF_WORLD_1(x) x
#else
#define DC_IF_WORLD_1(x)
#endif
#if DC_HAS_WORLD(2)
#define DC_IF_WORLD_2(x) x
#else
#define DC_IF_WORLD_2(x)
#endif
#if DC_HAS_WORLD(3)
#define DC_IF_WORLD_3(x) x
#else
#define DC_IF_WORLD_3(x)
#endif
#if DC_HAS_WORLD(4)
#define DC_IF_WORLD_4(x) x
#else
#define DC_IF_WORLD_4(x)
#endif
#if DC_HAS_WORLD(5)
#define DC_IF_WORLD_5(x) x
#else
#define DC_IF_WORLD_5(x)
#endif
#if DC_HAS_WORLD(6)
#define DC_IF_WORLD_6(x) x
#else
#define DC_IF_WORLD_6(x)
#endif
#if DC_HAS_WORLD(7)
#define DC_IF_WORLD_7(x) x
#else
#define DC_IF_WORLD_7(x)
#endif
#if DC_HAS_WORLD(8)
#define DC_IF_WORLD_8(x) x
#else
#define DC_IF_WORLD_8(x)
#endif
// `X(w)` for every world of this image with peers (2..8), and with world 1 as well.
#define DC_FOR_PEER_WORLDS(X) \
    DC_IF_WORLD_2(X(2)) DC_IF_WORLD_3(X(3)) DC_IF_WORLD_4(X(4)) DC_IF_WORLD_5(X(5)) \
    DC_IF_WORLD_6(X(6)) DC_IF_WORLD_7(X(7)) DC_IF_WORLD_8(X(8))
#define DC_FOR_WORLDS(X) DC_IF_WORLD_1(X(1)) DC_FOR_PEER_WORLDS(X)
#define DC_THREADS 512

// Segment flags.
#define DC_SEG_WRITE_BACK 1u  // reduce: also store the result into the own frame
#define DC_SEG_GATHER 2u      // phase 1: copy the peer's frame range instead of reducing
#define DC_SEG_SEND 4u        // push, send list: write src into this rank's slot of every peer
#define DC_SEG_SCATTER 8u     // push, send list: write shard q (src + q * bytes) to peer q only
#define DC_SEG_SEND_TO 16u    // bulk push, send list: write src into peer `peer`'s frame at frame_off
#define DC_SEG_AG 32u         // bulk push, send list: gathered data (signalled by the phase-1 flag)
#define DC_SEG_NORM_READ 64u  // phase 2 of a fused norm launch: no copy; the norm reads the peer's
                              // reduced shard where it lies (dc_norm_sum_at, detcoll_norm.h)

// DcHeader::mode.
#define DC_MODE_PULL 0u     // stage, publish ready flags, read the peers' frames
#define DC_MODE_PUSH_LL 1u  // write LL lines into the peers' slots, poll the own slots
#define DC_MODE_PUSH 2u     // write the peers' frames, one released flag per block and phase

// Error codes recorded in the host-mapped error record (mirrored in crates/collective-core/src/protocol/status.rs).
#define DC_ERR_TIMEOUT_READY 1ull
#define DC_ERR_TIMEOUT_PHASE2 2ull
#define DC_ERR_MISMATCH 3ull
#define DC_ERR_CORRUPT 4ull
#define DC_ERR_PEER_FAILED 5ull
#define DC_ERR_PEER_CLOSED 6ull

// What a closing peer stores into ack[peer] of every other rank's control block
// (collective-core/src/protocol/layout.rs, CLOSE_ACK).
#define DC_CLOSE_ACK 0xC105EDACull

struct DcSeg {
    dc_u64 ptr;        // stage/send: caller source; reduce/gather: caller destination
    dc_u64 src;        // push: the own values (own leaf of a reduce, own shard of a gather)
    dc_u64 frame_off;  // byte offset in the staging frame (push: payload offset in the slots)
    dc_u64 bytes;
    dc_u32 peer;       // gather: whose frame
    dc_u32 flags;
};

// Every rank's memory is two bases: its control block (status, signatures, flags; the `off_*`
// offsets are from it) and its frame 0 (frame f at data + frame[f]). CUDA keeps both in one
// allocation; HIP puts the control block in fine-grained memory and the frames in ordinary
// device memory (see Layout in collective-core/src/protocol/layout.rs).
struct DcHeader {
    dc_u64 ctl[DC_MAX_WORLD];   // every rank's control block, in rank order
    dc_u64 data[DC_MAX_WORLD];  // every rank's frame 0, in rank order
    dc_u64 err;                 // this rank's host-mapped error record (device address)
    dc_u64 timeout_ns;          // bound on every wait, in the device clock's units (dc_globaltimer:
                                // CUDA ns, HIP s_memrealtime ticks; see Device::wait_bound)
    dc_u64 sig[2];              // Signature::pack()
    dc_u64 frame[2];            // 0, Layout::frame_stride(): frame offsets from data[]
    dc_u32 off_status, off_sig0, off_sig1, off_ready, off_phase2, line;
    dc_u32 digest, rank, world, layout_blocks, grid, dtype, tile_bytes, nstage, nphase1, nphase2;
    dc_u32 off_ack;  // ack[0] of the own control block (ack[q] at off_ack + q * line)
    dc_u32 off_push; // push header of sender q, parity p: off_push + (p * DC_MAX_WORLD + q) * line
    dc_u32 off_ll;   // LL area; slot (parity p, sender q) at off_ll + (p * world + q) * ll_slot
    dc_u32 ll_slot;  // bytes of one LL slot (0: no LL area)
    dc_u32 mode;     // DC_MODE_PULL, DC_MODE_PUSH_LL or DC_MODE_PUSH
    dc_u32 off_pflag;  // bulk push flag (phase k, block b, sender q) at off_pflag + ((k * layout_blocks + b) * 8 + q) * line
    dc_u64 push_stride;  // bulk push: bytes between two senders' slots in a frame
    dc_u64 push_ag;      // bulk push: frame offset of the reduced-shard slots
};

template <int N>
struct DcParams {
    DcHeader h;
    DcSeg seg[N];
};

// Standalone fused tree: W inputs -> 1 output.
struct DcTreeParams {
    dc_u64 in[DC_MAX_WORLD];
    dc_u64 out;
    dc_u64 count;  // elements
    dc_u32 world;
    dc_u32 dtype;
};

// World-size-1 copy (cheaper to enqueue than cuMemcpyDtoDAsync).
struct DcCopyParams {
    dc_u64 dst;
    dc_u64 src;
    dc_u64 bytes;
};

// Residual add + RMSNorm after an all_reduce (detcoll_norm.h): for each of `rows` rows of
// `hidden` elements, h = residual + sum, y = rmsnorm(h) * weight. Addresses are row-major
// [rows, hidden] tensors of `dtype`, `weight` is [hidden].
struct DcNormParams {
    dc_u64 sum;       // the all_reduce's output
    dc_u64 residual;
    dc_u64 weight;
    dc_u64 h;         // out: residual + sum (may be exactly sum or residual)
    dc_u64 y;         // out: the normalised rows (may be exactly sum or residual)
    dc_u64 rows;
    dc_u32 hidden;    // 1 .. 2^24
    dc_u32 dtype;     // DC_F32, DC_F16, DC_BF16
    float eps;        // finite, >= 0
    dc_u32 pad;
};

// A fused launch's norm as its blocks run it: the parameters and the epilogue's two decisions
// from the launch's header (dc_norm_prepare, detcoll_norm.h), in shared memory.
struct DcNormPlan {
    DcNormParams n;
    dc_u32 group;       // rows per tile when every block normalises only rows it reduced, else 0
    dc_u32 gathered;    // 1: the norm reads the gathered sums in place (DC_SEG_NORM_READ)
    dc_u32 row_in_regs; // 1: the row form in registers with a row a tile (dc_norm_row_regs_ok,
                        // detcoll_norm.h); rows of two tiles (one-shot, LL push) have a body
                        // of their own, chosen at the entry (dc_norm_two_tile_rows)
    dc_u32 sum_is_y;    // 1: the sum's buffer is y's (the front door's fused call), so the row
                        // form's store of y overwrites every vector of the sum it reduced
};

// A fused launch's row as one thread holds it across the protocol in the row form in
// registers: its NV 16-byte vectors (dc_row_vector) of the block's row of the sum (kept by the
// reduce) and of the residual and the weight (loaded before the protocol's waits).
template <int NV>
struct DcNormRowRegs {
    dc_u32x4 sum[NV];
    dc_u32x4 residual[NV];
    dc_u32x4 weight[NV];
};

// Which 16-byte vector of its block's row thread DC_TID holds as its k-th (of NV) in the row
// form in registers: lane t % 256 of the norm's chunk (t / 256) * NV + k, i.e. vector
// ((t / 256) * NV + k) * 256 + t % 256 of the row (256: the norm's lanes, DC_NORM_THREADS, half
// of the block). One vector a thread (a row is a tile): vector t. Two (hidden 8192): threads
// t < 256 hold chunks 0 and 1 of lane t, threads 256 + t chunks 2 and 3, so each thread's
// squares continue one lane's partial in the norm's order.
template <int NV>
DC_DEV dc_u32 dc_row_vector(dc_u32 k) {
    return NV == 1 ? DC_TID : ((DC_TID >> 8) * (dc_u32)NV + k) * 256u + (DC_TID & 255u);
}

// The weight's vector for the thread's k-th vector of its row: the same lane of the same chunk,
// i.e. dc_row_vector, except for the row forms' pairs (two f16/bf16 rows of 4096 in one 16 KiB
// tile, two vectors a thread: detcoll_norm.h, dc_norm_row_pair_in_regs), where threads 256 + t
// hold lane t of the tile's second row (its chunks 0 and 1), whose weight is vector k * 256 + t.
template <int NV>
DC_DEV dc_u32 dc_row_weight_vector(dc_u32 k, dc_u32 hidden) {
    return NV == 2 && hidden == 4096u ? k * 256u + (DC_TID & 255u) : dc_row_vector<NV>(k);
}

#define DC_SEGS_SINGLE 16
#define DC_SEGS_MANY 32

// Status line words (own allocation, Layout::status()): written only by the owner's kernels.
#define DC_ST_ABORT 0    // first error code, via compare-and-swap; peers may read it
#define DC_ST_GEN 1      // last completed generation
#define DC_ST_FINISHED 2 // blocks of the running call that finished (u32 in this word)
#define DC_ST_REFRESH 3  // calls that still rewrite every LL line (set by a generation preset)

// Every LL line of every slot is rewritten (flag g - 2, so it never matches) when g mod 2^30 is
// 0 or 1: an LL line is then never more than 2^30 + 2 generations stale, far from the 2^32 at
// which a stale flag would read as current.
#define DC_LL_EPOCH_MASK 0x1FFFFFFFu

// The ABI table, exported by every image and checked by the host (cuda-ipc, hip-ipc) so a stale
// prebuilt image is refused. Defined here, at this point of the translation unit, rather than
// in the entry files: moving it would reorder the globals of the generated PTX.
extern "C" __device__ const dc_u32 detcoll_abi[8] = {
    DC_ABI_VERSION, (dc_u32)sizeof(DcParams<DC_SEGS_SINGLE>), (dc_u32)sizeof(DcParams<DC_SEGS_MANY>),
    (dc_u32)sizeof(DcTreeParams), (dc_u32)sizeof(DcSeg), (dc_u32)sizeof(DcCopyParams),
    (dc_u32)sizeof(DcNormParams), (dc_u32)(DC_WORLDS)};

DC_DEV dc_u64* dc_at(dc_u64 base, dc_u64 off) { return (dc_u64*)(base + off); }

// Signature::digest of the two packed signature words: FNV-1a over their 16 little-endian
// bytes, never 0.
DC_DEV dc_u32 dc_sig_digest(dc_u64 w0, dc_u64 w1) {
    dc_u32 h = 0x811c9dc5u;
    for (int i = 0; i < 16; ++i) {
        dc_u32 byte = (dc_u32)(((i < 8 ? w0 : w1) >> ((i % 8) * 8)) & 0xffu);
        h = (h ^ byte) * 0x01000193u;
    }
    return h == 0u ? 1u : h;
}

// Records the first failure of this rank: the status word decides the winner (device scope is
// enough, only this rank's blocks write it); the winner fills the host record, code last.
DC_DEV void dc_fail(const DcHeader& h, dc_u64* status, dc_u64 code, dc_u32 peer, dc_u32 g, dc_u64 observed) {
    if (DC_ATOMIC_CAS_U64(&status[DC_ST_ABORT], 0ull, code) != 0ull) return;
    volatile dc_u64* e = (volatile dc_u64*)h.err;
    e[1] = peer;
    e[2] = g;
    e[3] = observed;
    e[4] = h.sig[0];
    e[5] = h.sig[1];
    if (code == DC_ERR_MISMATCH) {
        // The peer stores its signature before the flag word we saw, but on the push routes
        // without a fence between them: read until the signature's digest is the flag's
        // (bounded), so the record names what the peer really called.
        const volatile dc_u64* theirs = (const volatile dc_u64*)(h.ctl[peer] + ((g & 1u) ? h.off_sig1 : h.off_sig0));
        dc_u64 a = theirs[0], b = theirs[1];
        const dc_u64 start = dc_globaltimer();
        while (dc_sig_digest(a, b) != (dc_u32)observed && dc_globaltimer() - start < h.timeout_ns) {
            a = theirs[0];
            b = theirs[1];
        }
        e[6] = a;
        e[7] = b;
    }
    DC_FENCE_SYSTEM();
    e[0] = code;
    DC_FENCE_SYSTEM();
}

// A pull wait that found a mismatch: what this rank's blocks publish for call g — the full
// signature, then this rank's word in every ready line — written now by the finding thread,
// before its abort, so that a peer waiting on any of our lines reads the mismatch itself (and
// names both calls: dc_fail reads our signature) instead of only our failure. Without it the
// line a peer's block watches may be published by one of our blocks that has not run yet (block
// 0 rewriting the unused flags at an epoch's first calls) or never will (it meets our abort
// first): on 1x H100 a fresh group whose ranks called 1 and 2 rows of 4096 had rank 0 report
// PeerFailed, not SignatureMismatch (2026-12-06). Our word never reads as ready to a rank whose
// call differs from ours; a rank whose call is ours waits on the mismatching rank's line too
// and fails there, so no rank reduces a line published without its data. The host executor
// (shm-ipc) does the same.
DC_DEV void dc_publish_mismatch(const DcHeader& h, dc_u32 g) {
    const dc_u64 own = h.ctl[h.rank];
    dc_u64* sig = dc_at(own, (g & 1u) ? h.off_sig1 : h.off_sig0);
    sig[0] = h.sig[0];
    sig[1] = h.sig[1];
    DC_FENCE_SYSTEM();
    const dc_u64 word = dc_flag_word(g, h.digest);
    for (dc_u32 blk = 0; blk < h.layout_blocks; ++blk)
        dc_st_relaxed_sys(dc_at(own, h.off_ready + (dc_u64)blk * h.line), word);
    DC_FENCE_SYSTEM();
}

// Waits until every peer's flag at `off` shows generation g with our digest (or g + 1).
// Threads 0..world-1 each watch one peer. Returns false (uniformly) if the call must end.
// Besides the bound, the slow path ends the wait early when the peer recorded a failure of its
// own, and a long wait (past 4096 polls, a few microseconds: never on the fast path) when the
// peer has closed its handle (its close acknowledgement is in our control block): neither will
// ever publish. A closing peer publishes its last flags before acknowledging, so the flag is
// read once more (acquire) after the acknowledgement is seen.
// `local`: the flags are this rank's own lines `off + peer * line` (the push headers that
// senders write into the receiver), instead of line `off` of every peer's control block. A
// local wait that finds a mismatch first publishes our own word in the peer's line, so both
// ranks of a mismatched call report the mismatch, not one of them only the other's failure (a
// pull wait, our word in our own lines: dc_publish_mismatch).
// TWO: also line `off2` of every peer (threads 32 + peer watch those, in parallel).
// OWN (with TWO, not local): also this rank's own lines `off` and `off2` (threads 64 and 65, in
// parallel with the peers'): for a reader of its own frame's tiles that other blocks of its own
// launch staged (the one-shot form of rows of two tiles), which no peer's flag orders.
template <bool TWO = false, bool OWN = false>
DC_DEV bool dc_wait(const DcHeader& h, dc_u64* status, dc_u32 off, dc_u32 g, dc_u64 timeout_code, bool local,
                    dc_u32 off2 = 0u) {
    static_assert(!OWN || TWO, "own lines beside two lines of every peer");
    DC_SHARED volatile int s_fail;
    // Every thread is done with the block's earlier shared words (the prologue's, a previous
    // wait's result) before thread 0 reuses any: compute-sanitizer's racecheck found thread 0's
    // store below racing with another thread's read of the prologue's words.
    DC_SYNC_BLOCK();
    if (DC_TID == 0) s_fail = 0;
    DC_SYNC_BLOCK();
    dc_u32 t = DC_TID;
    bool watch;
    if (OWN && !local && t >= 64u && t < 66u) {
        // Our own block's line: the same loop with this rank as the "peer" (its abort word is
        // our own, checked first; a close acknowledgement of our own is never written).
        if (t == 65u) off = off2;
        t = h.rank;
        watch = true;
    } else {
        if (TWO && t >= 32u) {
            t -= 32u;
            off = off2;
        }
        watch = t < h.world && t != h.rank;
    }
    if (watch) {
        const dc_u64* flag = local ? dc_at(h.ctl[h.rank], off + (dc_u64)t * h.line) : dc_at(h.ctl[t], off);
        const dc_u64* peer_status = dc_at(h.ctl[t], h.off_status);
        dc_u64 start = dc_globaltimer();
        dc_u32 iter = 0;
        for (;;) {
            dc_u64 v = dc_ld_acquire_sys(flag);
            int st = dc_flag_check(v, g, h.digest);
            if (st == DC_READY || st == DC_PASSED) break;
            if (st == DC_MISMATCH || st == DC_CORRUPT) {
                if (!local && st == DC_MISMATCH) dc_publish_mismatch(h, g);
                if (local && st == DC_MISMATCH) {
                    // Our own word into this peer's line first (what our block 0, or the
                    // sender's blocks, would publish there; a mismatching peer can only read it
                    // as a mismatch), ordered before our abort: the peer then finds the
                    // mismatch itself, even when the block that publishes there has not yet
                    // run (a late block 0 still refreshing its LL lines, or one that then sees
                    // our abort and returns), instead of only our failure (dc_wait's re-read).
                    dc_st_relaxed_sys(dc_at(h.ctl[t], off + (dc_u64)h.rank * h.line), dc_flag_word(g, h.digest));
                    DC_FENCE_SYSTEM();
                }
                dc_fail(h, status, st == DC_MISMATCH ? DC_ERR_MISMATCH : DC_ERR_CORRUPT, t, g, v);
                s_fail = 1;
                break;
            }
            ++iter;
            if ((iter & 15u) == 0) {
                if (dc_ld_relaxed_sys(&status[DC_ST_ABORT]) != 0) {  // another block of ours failed
                    s_fail = 1;
                    break;
                }
                dc_u64 pa = dc_ld_acquire_sys(&peer_status[DC_ST_ABORT]);
                if (pa != 0) {  // the peer failed and will never publish
                    // Unless it failed on a mismatch with us: it publishes its word to us before
                    // its abort (above), so the flag read again after the abort shows it.
                    v = dc_ld_acquire_sys(flag);
                    st = dc_flag_check(v, g, h.digest);
                    if (st == DC_MISMATCH) dc_fail(h, status, DC_ERR_MISMATCH, t, g, v);
                    else dc_fail(h, status, DC_ERR_PEER_FAILED, t, g, pa);
                    s_fail = 1;
                    break;
                }
                if (dc_globaltimer() - start > h.timeout_ns) {
                    dc_fail(h, status, timeout_code, t, g, v);
                    s_fail = 1;
                    break;
                }
                if (iter > 4096u) {
                    // A long wait only (the fast path pays nothing): has the peer closed?
                    if (dc_ld_relaxed_sys(dc_at(h.ctl[h.rank], h.off_ack + (dc_u64)t * h.line)) == DC_CLOSE_ACK) {
                        v = dc_ld_acquire_sys(flag);
                        st = dc_flag_check(v, g, h.digest);
                        if (st == DC_READY || st == DC_PASSED) break;
                        dc_fail(h, status, DC_ERR_PEER_CLOSED, t, g, v);
                        s_fail = 1;
                        break;
                    }
                    dc_nanosleep(256);
                }
            }
        }
    }
    DC_SYNC_BLOCK();
    return s_fail == 0;
}

// Calls body(lo, hi, start) for every piece [lo, hi) of [seg_lo, seg_lo + bytes) that lies in a
// tile of this block, `start` being that tile's first byte. Tile t is block t % grid's; `b` is
// a protocol block (b < grid: a fused launch's blocks beyond the grid walk no tiles). A segment
// that starts in tile 0 (a single launch's: frame offset 0) starts this block at tile b without
// a division; otherwise the first tile's index takes one (the 64-bit divisions are long
// routines, and the send, the receive and the refresh of a call each walk the tiles).
template <class F>
DC_DEV void dc_for_tiles_at(dc_u64 seg_lo, dc_u64 bytes, dc_u64 tile, dc_u32 grid, dc_u32 b, F body) {
    if (bytes == 0) return;
    const dc_u64 seg_hi = seg_lo + bytes;
    dc_u64 t = b;
    if (seg_lo >= tile) {
        t = seg_lo / tile;
        const dc_u64 r = t % grid;
        t += (b + grid - r) % grid;
    }
    for (; t * tile < seg_hi; t += grid) {
        const dc_u64 start = t * tile;
        const dc_u64 lo = start > seg_lo ? start : seg_lo;
        const dc_u64 hi = start + tile < seg_hi ? start + tile : seg_hi;
        body(lo, hi, start);
    }
}

// Calls body(lo, hi) for every piece of [seg_lo, seg_hi) that lies in a tile of this block.
template <class F>
DC_DEV void dc_for_tiles(dc_u64 seg_lo, dc_u64 bytes, dc_u64 tile, dc_u32 grid, dc_u32 b, F body) {
    dc_for_tiles_at(seg_lo, bytes, tile, grid, b, [&](dc_u64 lo, dc_u64 hi, dc_u64) { body(lo, hi); });
}

template <int W, int DT>
DC_DEV void dc_reduce_piece(const DcHeader& h, dc_u64 frame, dc_u64 x, dc_u64 n, dc_u8* dst, dc_u8* wb) {
    const dc_u8* src[W];
#pragma unroll
    for (int i = 0; i < W; ++i) src[i] = (const dc_u8*)(h.data[i] + frame + x);
    dc_reduce_range<W, DT, false>(src, dst, wb, n, DC_TID, DC_NTID);
}

template <int W>
DC_DEV void dc_reduce_piece_any(const DcHeader& h, dc_u64 frame, dc_u64 x, dc_u64 n, dc_u8* dst, dc_u8* wb) {
    switch (h.dtype) {
        case DC_F32: dc_reduce_piece<W, DC_F32>(h, frame, x, n, dst, wb); break;
        case DC_F16: dc_reduce_piece<W, DC_F16>(h, frame, x, n, dst, wb); break;
        default: dc_reduce_piece<W, DC_BF16>(h, frame, x, n, dst, wb); break;
    }
}

// Phase-1/phase-2 work of one segment, for this block's tiles (W: the call's world).
template <int W>
DC_DEV void dc_run_segment(const DcHeader& h, const DcSeg& s, dc_u64 frame, bool gather) {
    const dc_u32 b = DC_BID;
    dc_u64 own = h.data[h.rank];
    dc_for_tiles(s.frame_off, s.bytes, h.tile_bytes, h.grid, b, [&](dc_u64 lo, dc_u64 hi) {
        dc_u8* dst = (dc_u8*)(s.ptr + (lo - s.frame_off));
        if (gather) {
            const dc_u8* src = (const dc_u8*)(h.data[s.peer] + frame + lo);
            dc_copy_range(dst, src, hi - lo, DC_TID, DC_NTID);
        } else {
            dc_u8* wb = (s.flags & DC_SEG_WRITE_BACK) ? (dc_u8*)(own + frame + lo) : (dc_u8*)0;
            dc_reduce_piece_any<W>(h, frame, lo, hi - lo, dst, wb);
        }
    });
}

// The one-shot pull reduce of a fused launch's row form in registers (dc_norm_row_regs_ok,
// dc_norm_two_tile_rows; detcoll_norm.h): segment `s` is the whole sum from frame offset 0 and block b's row b is its
// NV tiles (b * NV ..; row `r`, b + k * grid, in the row loop), one 16-byte vector of each per thread, so thread t reduces its vectors
// of the row (dc_row_vector) exactly as dc_run_segment would (the same tree, loads and stores)
// and also keeps them. Written out rather than through dc_reduce_vector: with that helper's
// source and write-back pointers the compiler laid out the whole one-shot body differently
// (sm_90 PTX), which an unmeasured refactor should not do. `store_sum` false (DcNormPlan::sum_is_y):
// the sum is not stored, the thread's store of y to the same bytes follows (one store of the
// output instead of two: 0.4 us per fused call at world 2, one row of 8192, on one H200).
template <int W, int DT, int NV>
DC_DEV void dc_reduce_row_kept(const DcHeader& h, const DcSeg& s, dc_u64 frame, dc_u32x4 (&kept)[NV], bool store_sum,
                               dc_u64 r) {
    const dc_u64 row = r * (NV * h.tile_bytes);
    if (row + 16u * (dc_u64)DC_TID >= s.bytes) return;  // a block without a row
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const dc_u64 off = row + 16u * (dc_u64)dc_row_vector<NV>(k);
        dc_u32x4 v[W];
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = *(const dc_u32x4*)(h.data[i] + frame + off);
        const dc_u32x4 r = dc_tree_vec<W, DT, false>(v);
        if (store_sum) *(dc_u32x4*)(s.ptr + off) = r;
        if (s.flags & DC_SEG_WRITE_BACK) *(dc_u32x4*)(h.data[h.rank] + frame + off) = r;
        kept[k] = r;
    }
}

template <int W, int NV>
DC_DEV void dc_reduce_row_kept_any(const DcHeader& h, const DcSeg& s, dc_u64 frame, dc_u32x4 (&kept)[NV], bool store_sum,
                                   dc_u64 r) {
    if (h.dtype == DC_F16) dc_reduce_row_kept<W, DC_F16, NV>(h, s, frame, kept, store_sum, r);
    else dc_reduce_row_kept<W, DC_BF16, NV>(h, s, frame, kept, store_sum, r);
}

// ---------------------------------------------------------------------------------------------
// The LL push route (DC_MODE_PUSH_LL). Rank r writes its values as LL lines into slot
// (parity g % 2, sender r) of every peer's LL area (reduce_scatter: shard q to peer q only),
// then polls only its own slots: a line whose four flags equal g holds the sender's payload of
// call g. The tree runs over the own slots in rank order, with the own leaf read from the
// caller's input. Slots are double-buffered by parity: a sender writes parity p again only in
// call g + 2, which it starts after completing g + 1, which needed every receiver's g + 1 lines,
// which a receiver sends only after completing call g — so no line is overwritten while it is
// still to be read (docs/protocol.md has the whole argument).
//
// Chunks: payload offset o (16-byte aligned) of a slot is carried by thread (o / 16) % threads of
// block (o / tile) % grid, in the send, the receive and the epoch refresh alike, so one thread
// writes a line's refresh before its data (same address, program order), and an in-place call
// reads its own input chunk (send) before it overwrites it (receive). A fused launch in the row
// form of two tiles a row (NV = 2, hidden 8192) walks units of two tiles instead: unit u is block
// u % grid's, and thread t carries its two vectors of the row (dc_row_vector<2>), in all three
// alike. Which thread carries a line is the sender's own business (a receiver reads lines, not
// threads), so ranks need not agree on it.
// ---------------------------------------------------------------------------------------------

DC_DEV dc_u8* dc_ll_slot(const DcHeader& h, dc_u32 owner, dc_u32 parity, dc_u32 sender) {
    return (dc_u8*)(h.ctl[owner] + h.off_ll + ((dc_u64)parity * h.world + sender) * h.ll_slot);
}

// Calls body(o, n, k) for this thread's chunks of every unit of NV tiles of [seg_lo, seg_lo +
// bytes) that belongs to this block: payload offset o of the slot, n (1..16) bytes from it, k
// the chunk's index among the thread's NV of the unit. NV = 1: chunk t of the tile. NV = 2 (a
// unit is a row of two tiles, 16 * threads bytes each): the thread's vectors of the row,
// dc_row_vector<2>(0) and (1). The call's tile: an LL call's is always 16 * threads bytes (the
// host sets the wide 16 KiB tile only on bulk push and RS+AG, for the row forms in the
// protocol), with which the walk covers each 16-byte line of a unit exactly once.
template <int NV = 1, class F>
DC_DEV void dc_for_chunks(const DcHeader& h, dc_u64 seg_lo, dc_u64 bytes, F body) {
    const dc_u64 unit = (dc_u64)NV * h.tile_bytes;
    dc_for_tiles_at(seg_lo, bytes, unit, h.grid, DC_BID, [&](dc_u64 lo, dc_u64 hi, dc_u64 start) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const dc_u64 o = start + 16u * (dc_u64)dc_row_vector<NV>((dc_u32)k);
            if (o >= lo && o < hi) body(o, hi - o < 16u ? hi - o : 16u, k);
        }
    });
}

// Polls one LL line of `peer` until it carries generation g. A bound, a failure of our own or
// of the peer, and (in long waits) the peer's close end it with an error record (false).
DC_DEV bool dc_ll_wait(const DcHeader& h, dc_u64* status, const dc_u8* line, dc_u32 g, dc_u32 peer, dc_u32x4& v) {
    if (dc_ll_load(line, g, v)) return true;
    const dc_u64 start = dc_globaltimer();
    for (dc_u32 iter = 1;; ++iter) {
        if (dc_ll_load(line, g, v)) return true;
        if ((iter & 63u) != 0) continue;
        if (dc_ld_relaxed_sys(&status[DC_ST_ABORT]) != 0) return false;
        dc_u64 pa = dc_ld_relaxed_sys(&dc_at(h.ctl[peer], h.off_status)[DC_ST_ABORT]);
        if (pa != 0) {
            dc_fail(h, status, DC_ERR_PEER_FAILED, peer, g, pa);
            return false;
        }
        if (dc_globaltimer() - start > h.timeout_ns) {
            dc_fail(h, status, DC_ERR_TIMEOUT_READY, peer, g, (dc_u64)v.x);
            return false;
        }
        if (iter > 4096u) {
            if (dc_ld_relaxed_sys(dc_at(h.ctl[h.rank], h.off_ack + (dc_u64)peer * h.line)) == DC_CLOSE_ACK) {
                if (dc_ll_load(line, g, v)) return true;
                dc_fail(h, status, DC_ERR_PEER_CLOSED, peer, g, 0);
                return false;
            }
            dc_nanosleep(128);
        }
    }
}

// Rewrites every line of this rank's slot of parity g % 2 in every peer with flag g - 2 (never
// current: a receiver at g waits for g, at g + 2 for g + 2), before this call's data. Any call
// may be the one that refreshes (the epoch's, or a preset's), whatever its route, so the walk
// is by tiles of 16 * threads bytes whatever the call's own tile. `LL` (an LL call's body): the
// walk of its sends (dc_for_chunks, NV as theirs: 2 in the row form of two tiles; the call's
// tile, which on LL is always 16 * threads bytes, so the same walk), so each line's refresh is
// written by the thread that then writes its data, in program order (see above); a call on
// another route writes no LL line after it, and walks by 16 * threads explicitly: by its own
// tile it would miss half of every tile's lines with the 16 KiB tile (bulk push and RS+AG in a
// row form in the protocol; dc_for_chunks takes one 16-byte line a thread per tile), and a line
// no LL call rewrote for 2^32 generations would then read as current. (The LL bodies keep
// their code exactly: dc_for_chunks as before.)
template <int NV, bool LL>
DC_DEV void dc_ll_refresh(const DcHeader& h, dc_u32 g) {
    dc_u32x4 zero;
    zero.x = zero.y = zero.z = zero.w = 0u;
    const dc_u64 payload = h.ll_slot / 2u;
    if constexpr (LL) {
        dc_for_chunks<NV>(h, 0, payload, [&](dc_u64 o, dc_u64, int) {
            for (dc_u32 q = 0; q < h.world; ++q)
                if (q != h.rank) dc_ll_store(dc_ll_slot(h, q, g & 1u, h.rank) + 2u * o, zero, g - 2u);
        });
    } else {
        // Line t of every 16 * threads bytes, those b, b + grid, ... of this block.
        const dc_u64 tile = 16u * (dc_u64)DC_NTID;
        dc_for_tiles_at(0, payload, tile, h.grid, DC_BID, [&](dc_u64, dc_u64 hi, dc_u64 start) {
            const dc_u64 o = start + 16u * (dc_u64)DC_TID;
            if (o >= hi) return;
            for (dc_u32 q = 0; q < h.world; ++q)
                if (q != h.rank) dc_ll_store(dc_ll_slot(h, q, g & 1u, h.rank) + 2u * o, zero, g - 2u);
        });
    }
}

template <int NV>
DC_DEV void dc_push_send(const DcHeader& h, const DcSeg& s, dc_u32 g) {
    const bool scatter = (s.flags & DC_SEG_SCATTER) != 0;
    dc_for_chunks<NV>(h, s.frame_off, s.bytes, [&](dc_u64 o, dc_u64 n, int) {
        const dc_u64 rel = o - s.frame_off;
        dc_u32x4 v = dc_load16((const dc_u8*)(s.ptr + rel), n);
        for (dc_u32 q = 0; q < h.world; ++q) {
            if (q == h.rank) continue;
            if (scatter) v = dc_load16((const dc_u8*)(s.ptr + (dc_u64)q * s.bytes + rel), n);
            dc_ll_store(dc_ll_slot(h, q, g & 1u, h.rank) + 2u * o, v, g);
        }
    });
}

// The lines at payload offset `o` of every peer's slot into v[q] (v[rank] is left alone): every
// pending line is loaded in each round before any is checked, so the W - 1 loads are in flight
// together instead of one peer's latency after another's. Bounded like dc_ll_wait, which takes
// over (naming the peer) for the first line still missing after a short spin.
template <int W>
DC_DEV bool dc_ll_poll_all(const DcHeader& h, dc_u64* status, dc_u64 o, dc_u32 g, dc_u32x4 (&v)[W]) {
    dc_u32 pending = ((1u << W) - 1u) & ~(1u << h.rank);
    for (int round = 0; round < 64 && pending; ++round) {
#pragma unroll
        for (int q = 0; q < W; ++q)
            if ((pending >> q) & 1u)
                if (dc_ll_load(dc_ll_slot(h, h.rank, g & 1u, q) + 2u * o, g, v[q])) pending &= ~(1u << q);
    }
#pragma unroll
    for (int q = 0; q < W; ++q)
        if ((pending >> q) & 1u)
            if (!dc_ll_wait(h, status, dc_ll_slot(h, h.rank, g & 1u, q) + 2u * o, g, q, v[q])) return false;
    return true;
}

// `keep` (a fused launch's row in registers): also this thread's reduced vector into `kept`,
// which is then its vector of its block's one tile.
template <int W, int DT>
DC_DEV bool dc_push_reduce(const DcHeader& h, dc_u64* status, const DcSeg& s, dc_u32 g, bool keep, dc_u32x4& kept) {
    bool ok = true;
    dc_for_chunks(h, s.frame_off, s.bytes, [&](dc_u64 o, dc_u64 n, int) {
        if (!ok) return;
        const dc_u64 rel = o - s.frame_off;
        dc_u32x4 v[W];
#pragma unroll
        for (int q = 0; q < W; ++q)
            if ((dc_u32)q == h.rank) v[q] = dc_load16((const dc_u8*)(s.src + rel), n);
        if (!dc_ll_poll_all<W>(h, status, o, g, v)) {
            ok = false;
            return;
        }
        const dc_u32x4 r = dc_tree_vec<W, DT, false>(v);
        dc_store16((dc_u8*)(s.ptr + rel), r, n);
        if (keep) kept = r;
    });
    return ok;
}

// The reduce of a fused launch in the row form of two tiles a row (NV = 2; dc_norm_two_tile_rows:
// the segment is the whole sum from payload offset 0, f16/bf16, rows <= grid, whole 16-byte
// vectors): block b < rows reduces row b, the unit its sends carried (dc_for_chunks<2>), and
// thread t its two vectors of it (dc_row_vector<2>), kept in `kept`. Both vectors' lines from
// every peer are polled together, as dc_ll_poll_all does for the peers of one vector: one round
// trip after the last line lands instead of one per vector. `store_sum` false
// (DcNormPlan::sum_is_y): the sum is not stored, the row form's store of y to the same bytes
// follows.
template <int W, int DT, int NV>
DC_DEV bool dc_push_reduce_row(const DcHeader& h, dc_u64* status, const DcSeg& s, dc_u32 g, bool store_sum,
                               dc_u32x4 (&kept)[NV]) {
    const dc_u64 row = (dc_u64)DC_BID * ((dc_u64)NV * h.tile_bytes);
    if (row >= s.bytes) return true;  // a block without a row
    dc_u64 rel[NV];
    dc_u32x4 v[NV][W];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        rel[k] = row + 16u * (dc_u64)dc_row_vector<NV>((dc_u32)k);
#pragma unroll
        for (int q = 0; q < W; ++q)
            if ((dc_u32)q == h.rank) v[k][q] = dc_load16((const dc_u8*)(s.src + rel[k]), 16u);
    }
    dc_u32 pending = ((1u << (NV * W)) - 1u);
#pragma unroll
    for (int k = 0; k < NV; ++k) pending &= ~(1u << (k * W + (int)h.rank));
    for (int round = 0; round < 64 && pending; ++round) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int q = 0; q < W; ++q)
                if ((pending >> (k * W + q)) & 1u)
                    if (dc_ll_load(dc_ll_slot(h, h.rank, g & 1u, q) + 2u * (s.frame_off + rel[k]), g, v[k][q]))
                        pending &= ~(1u << (k * W + q));
    }
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int q = 0; q < W; ++q)
            if ((pending >> (k * W + q)) & 1u)
                if (!dc_ll_wait(h, status, dc_ll_slot(h, h.rank, g & 1u, q) + 2u * (s.frame_off + rel[k]), g, q, v[k][q]))
                    return false;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const dc_u32x4 r = dc_tree_vec<W, DT, false>(v[k]);
        if (store_sum) dc_store16((dc_u8*)(s.ptr + rel[k]), r, 16u);
        kept[k] = r;
    }
    return true;
}

DC_DEV bool dc_push_gather(const DcHeader& h, dc_u64* status, const DcSeg& s, dc_u32 g) {
    bool ok = true;
    dc_for_chunks(h, s.frame_off, s.bytes, [&](dc_u64 o, dc_u64 n, int) {
        if (!ok) return;
        const dc_u64 rel = o - s.frame_off;
        dc_u32x4 v;
        if (s.peer == h.rank) {
            v = dc_load16((const dc_u8*)(s.src + rel), n);
        } else if (!dc_ll_wait(h, status, dc_ll_slot(h, h.rank, g & 1u, s.peer) + 2u * o, g, s.peer, v)) {
            ok = false;
            return;
        }
        dc_store16((dc_u8*)(s.ptr + rel), v, n);
    });
    return ok;
}

// NV = 2: a fused launch in the row form of two tiles a row (sends by units of two tiles,
// dc_for_chunks<2>; the reduce dc_push_reduce_row); it has no gather segment. `store_sum`: NV = 2
// only (NV = 1 always stores the sum: skipping it measured no faster there).
template <int W, int NV>
DC_DEV void dc_push_ll(const DcHeader& h, const DcSeg* seg, dc_u64* status, dc_u32 g, bool keep, bool store_sum,
                       dc_u32x4 (&kept)[NV]) {
    for (dc_u32 i = 0; i < h.nstage; ++i) dc_push_send<NV>(h, seg[i], g);
    // Every block learns from the push headers in its own memory that every sender makes this
    // call (a mismatching sender's lines are never read) before it consumes any line.
    const bool started = dc_wait(h, status, h.off_push + (g & 1u) * DC_MAX_WORLD * h.line, g, DC_ERR_TIMEOUT_READY, true);
    DC_GRID_DEP_TRIGGER();  // every peer is running this call (see dc_collective)
    if (!started) return;
    for (dc_u32 i = 0; i < h.nphase1; ++i) {
        const DcSeg& s = seg[h.nstage + i];
        bool ok;
        if constexpr (NV != 1) {
            // The row form of two tiles a row: f16/bf16 only (dc_norm_two_tile_rows), no gather.
            if (h.dtype == DC_F16) ok = dc_push_reduce_row<W, DC_F16, NV>(h, status, s, g, store_sum, kept);
            else ok = dc_push_reduce_row<W, DC_BF16, NV>(h, status, s, g, store_sum, kept);
        } else if (s.flags & DC_SEG_GATHER) {
            ok = dc_push_gather(h, status, s, g);
        } else {
            switch (h.dtype) {
                case DC_F32: ok = dc_push_reduce<W, DC_F32>(h, status, s, g, keep, kept[0]); break;
                case DC_F16: ok = dc_push_reduce<W, DC_F16>(h, status, s, g, keep, kept[0]); break;
                default: ok = dc_push_reduce<W, DC_BF16>(h, status, s, g, keep, kept[0]); break;
            }
        }
        if (!ok) return;
    }
}

// ---------------------------------------------------------------------------------------------
// The bulk push route (DC_MODE_PUSH), for large messages. Rank r copies each slice of its input
// straight into its owner's frame (slot r of the receiving rank, frame g % 2), then block b
// releases its flag (phase 0, b, r) in that peer: the block's stores are ordered before it by
// the barrier and the release's cumulativity, as in the pull route's staging. The owner waits
// for its own flags (local polls), reduces its shard over [own input, slot 0, slot 1, ...] in
// rank order into the output and, for all_reduce, writes the reduced tile into every peer's
// frame (reduced-shard slot r) and releases (phase 1, b, r); then it copies every peer's reduced
// shard from its own frame. all_gather is the second half alone (its input into every peer's
// slot, phase-1 flags). Tiles are counted from each slot's start, so block b of every rank
// writes, waits for and reads the same tiles. Frames are double-buffered by parity as in the
// pull route: a sender writes frame g % 2 of a peer again only in call g + 2, after it completed
// g + 1, which needed that peer's flags of g + 1, published after the peer finished g.
// ---------------------------------------------------------------------------------------------

DC_DEV dc_u64* dc_pflag(const DcHeader& h, dc_u32 owner, dc_u32 phase, dc_u32 block, dc_u32 sender) {
    return dc_at(h.ctl[owner],
                 h.off_pflag + (((dc_u64)phase * h.layout_blocks + block) * DC_MAX_WORLD + sender) * h.line);
}

// This block's flag of `phase` into every peer, after every thread's stores of the block: one
// system-scope release fence (cumulative over the block's stores, ordered before it by the
// barrier), then relaxed stores — a release pattern without a fence per peer.
DC_DEV void dc_bulk_signal(const DcHeader& h, dc_u32 phase, dc_u64 word) {
    DC_SYNC_BLOCK();
    if (DC_TID == 0) {
        DC_FENCE_RELEASE_SYSTEM();
        for (dc_u32 q = 0; q < h.world; ++q)
            if (q != h.rank) dc_st_relaxed_sys(dc_pflag(h, q, phase, DC_BID, h.rank), word);
    }
}

DC_DEV bool dc_bulk_wait(const DcHeader& h, dc_u64* status, dc_u32 phase, dc_u32 g, dc_u64 code) {
    dc_u32 off = h.off_pflag + ((phase * h.layout_blocks + DC_BID) * DC_MAX_WORLD) * h.line;
    return dc_wait(h, status, off, g, code, true);
}

template <int W, int DT>
DC_DEV void dc_bulk_reduce(const DcHeader& h, const DcSeg& s, dc_u64 frame) {
    const dc_u64 own = h.data[h.rank] + frame;
    const bool push = (s.flags & DC_SEG_WRITE_BACK) != 0;
    // The first peer's reduced-shard slot is written by the reduction itself (write-back); the
    // others are copies of the output after a barrier.
    const dc_u32 first = h.rank == 0u ? 1u : 0u;
    dc_for_tiles(0, s.bytes, h.tile_bytes, h.grid, DC_BID, [&](dc_u64 lo, dc_u64 hi) {
        const dc_u8* src[W];
#pragma unroll
        for (int q = 0; q < W; ++q)
            src[q] = (dc_u32)q == h.rank ? (const dc_u8*)(s.src + lo)
                                         : (const dc_u8*)(own + s.frame_off + (dc_u64)q * h.push_stride + lo);
        dc_u8* dst = (dc_u8*)(s.ptr + lo);
        dc_u8* wb = push ? (dc_u8*)(h.data[first] + frame + h.push_ag + (dc_u64)h.rank * h.push_stride + lo) : (dc_u8*)0;
        dc_reduce_range<W, DT, false>(src, dst, wb, hi - lo, DC_TID, DC_NTID);
        if (push && W > 2) {
            DC_SYNC_BLOCK();
            for (dc_u32 t = first + 1u; t < (dc_u32)W; ++t)
                if (t != h.rank)
                    dc_copy_range((dc_u8*)(h.data[t] + frame + h.push_ag + (dc_u64)h.rank * h.push_stride + lo), dst,
                                  hi - lo, DC_TID, DC_NTID);
        }
    });
}

// Copies a peer's slot of the own frame (or, for this rank, its own input) to the output.
DC_DEV void dc_bulk_gather(const DcHeader& h, const DcSeg& s, dc_u64 frame) {
    const dc_u8* from = s.peer == h.rank ? (const dc_u8*)s.src : (const dc_u8*)(h.data[h.rank] + frame + s.frame_off);
    dc_for_tiles(0, s.bytes, h.tile_bytes, h.grid, DC_BID, [&](dc_u64 lo, dc_u64 hi) {
        dc_copy_range((dc_u8*)(s.ptr + lo), from + lo, hi - lo, DC_TID, DC_NTID);
    });
}

// The bulk rows form's two halves (detcoll_norm.h; ROWS below), NV vectors a thread of each row.
template <int W, int NV>
DC_DEV void dc_bulk_reduce_rows(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                                DcNormRowRegs<NV>& regs);
template <int NV>
DC_DEV void dc_bulk_norm_rows(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormPlan& plan,
                              DcNormRowRegs<NV>& regs);

// ROWS: a fused launch in the bulk rows form (dc_norm_bulk_rows, detcoll_norm.h; `norm` and
// `regs` are used only then): the own shard's rows are reduced and normalised in registers
// (dc_bulk_reduce_rows), and after phase 2 the peers' rows are normalised from their reduced
// shards in the own frame (dc_bulk_norm_rows), instead of the copies. The flags, the tiles each
// block stages, writes back and waits for, and so what a peer sees, are the plain call's. NV:
// the vectors a thread holds of each row (2 in the 16 KiB tile of rows of 8192; ROWS only).
template <int W, bool ROWS = false, int NV = 1>
DC_DEV void dc_push_bulk(const DcHeader& h, const DcSeg* seg, dc_u64* status, dc_u32 g, dc_u64 word,
                         const DcNormPlan* norm = 0, DcNormRowRegs<NV>* regs = 0) {
    const dc_u64 frame = h.frame[g & 1u];
    const dc_u32 first_phase = (h.nstage > 0u && (seg[0].flags & DC_SEG_AG)) ? 1u : 0u;
    for (dc_u32 i = 0; i < h.nstage; ++i) {
        const DcSeg& s = seg[i];
        dc_u8* to = (dc_u8*)(h.data[s.peer] + frame + s.frame_off);
        dc_for_tiles(0, s.bytes, h.tile_bytes, h.grid, DC_BID, [&](dc_u64 lo, dc_u64 hi) {
            dc_copy_range(to + lo, (const dc_u8*)(s.ptr + lo), hi - lo, DC_TID, DC_NTID);
        });
    }
    dc_bulk_signal(h, first_phase, word);
    const bool started = dc_bulk_wait(h, status, first_phase, g, DC_ERR_TIMEOUT_READY);
    DC_GRID_DEP_TRIGGER();  // every peer is running this call (see dc_collective)
    if (!started) return;
    for (dc_u32 i = 0; i < h.nphase1; ++i) {
        const DcSeg& s = seg[h.nstage + i];
        if (s.flags & DC_SEG_GATHER) {
            dc_bulk_gather(h, s, frame);
        } else if constexpr (ROWS) {
            dc_bulk_reduce_rows<W, NV>(h, s, frame, *norm, *regs);
        } else {
            switch (h.dtype) {
                case DC_F32: dc_bulk_reduce<W, DC_F32>(h, s, frame); break;
                case DC_F16: dc_bulk_reduce<W, DC_F16>(h, s, frame); break;
                default: dc_bulk_reduce<W, DC_BF16>(h, s, frame); break;
            }
        }
    }
    if (h.nphase2) {
        dc_bulk_signal(h, 1u, word);
        if (!dc_bulk_wait(h, status, 1u, g, DC_ERR_TIMEOUT_PHASE2)) return;
        if constexpr (ROWS) {
            dc_bulk_norm_rows<NV>(h, seg, frame, *norm, *regs);
            return;
        }
        for (dc_u32 i = 0; i < h.nphase2; ++i) {
            const DcSeg& s = seg[h.nstage + h.nphase1 + i];
            if ((s.flags & DC_SEG_NORM_READ) == 0u) dc_bulk_gather(h, s, frame);
        }
    }
}

// One body per protocol mode for both parameter sizes (each compiled once): `h` and `seg` point
// into the kernel's parameter space (CUDA: __grid_constant__; HIP: the kernarg segment), no copy.
// The mode is a template parameter so that a call runs a function holding only its own
// protocol's code (a smaller instruction footprint per launch), not one body with all three.
//
// With `norm` (the fused all_reduce + RMSNorm's launch), every block runs the norm after its
// part of the protocol and before the end of the call; plain calls pass null. A fused launch may
// have more blocks than the protocol's grid (for rows): blocks from h.grid on take no part in the
// protocol (no tiles, flags or counts) and only run the norm. The norm is dc_norm_epilogue
// (detcoll_norm.h: a barrier of the launch's blocks or of the block, then the rows), one
// out-of-line function, not a template parameter: every mode's body stays one instantiation per
// image. It returns whether its barrier of every block of the launch ended the call
// (dc_call_ended), which the end of the call then skips. The exception is the row form in
// registers on LL push and one-shot (dc_norm_row_in_regs_any: one row per block, from the
// reduced vector each thread kept), inlined into those bodies: out of line it cost 0.3-0.6 us
// per fused call at world 2 on one H200 (the call, and the registers passed through the stack).
DC_DEV_NOINLINE bool dc_norm_epilogue(const DcHeader& h, const DcSeg* seg, dc_u64* status, dc_u32 g,
                                      dc_u64 refresh_left, const DcNormPlan& plan);
template <int NV>
DC_DEV void dc_norm_row_regs_load(const DcNormPlan& plan, DcNormRowRegs<NV>& regs);
template <int NV>
DC_DEV void dc_norm_row_in_regs_any(const DcNormParams& p, const DcNormRowRegs<NV>& r, dc_u64 row);
DC_DEV bool dc_norm_two_tile_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p);
DC_DEV bool dc_norm_row_loop(const DcHeader& h, const DcSeg* seg, const DcNormParams& p);
DC_DEV dc_u32 dc_norm_bulk_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p);
DC_DEV dc_u32 dc_norm_rsag_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p);
template <int W, int NV>
DC_DEV void dc_rsag_reduce_rows(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                                DcNormRowRegs<NV>& regs);
template <int NV>
DC_DEV void dc_rsag_norm_rows(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormPlan& plan,
                              DcNormRowRegs<NV>& regs);
template <int W, int NV>
DC_DEV void dc_norm_rows_kept(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                              DcNormRowRegs<NV>& regs);

// The end of call g, once every block of its launch has started (so has read the generation
// in its prologue): the generation advances and a requested refresh counts down from the value
// the prologue saw (`refresh_left`). Plain stores: the only readers are the next launches on
// this stream, which start, or pass their DC_GRID_DEP_WAIT, only after this launch has ended
// and its stores are visible.
DC_DEV void dc_call_ended(dc_u64* status, dc_u32 g, dc_u64 refresh_left) {
    if (refresh_left != 0u) *(volatile dc_u64*)&status[DC_ST_REFRESH] = refresh_left - 1u;
    *(volatile dc_u64*)&status[DC_ST_GEN] = (dc_u64)g;
}
DC_DEV void dc_norm_prepare(const DcHeader& h, const DcSeg* seg, const DcNormParams& p, DcNormPlan& plan);

// NV = 2 alone: the one-shot or LL push body of a fused launch in the row form for rows of two
// tiles (dc_norm_two_tile_rows), its own instantiation: holding two vectors of the sum, residual
// and weight across the waits in the shared body cost every other fused launch 0.3-1.2 us on
// one H200 (benches/results/h200-2026-12-04-two-tile-row-form.md). NV = 1: every other launch.
// LOOP: the one-shot body of a fused launch in the row form with more rows than its blocks
// take one at a time (dc_norm_row_loop): each block reduces and normalises its rows (b, b +
// grid, ... of a tile each) one after the other in registers (dc_norm_rows_kept); on bulk push,
// the bulk rows form (dc_norm_bulk_rows: the own shard's rows the same way, the peers' after
// phase 2). Each an instantiation of its own, so that the plain all_reduce's body is the one it
// was.
// SHARDS: the RS+AG body of a fused launch in the RS+AG rows form (dc_norm_rsag_rows): the own
// shard's rows reduced and normalised in registers, then, after phase 2, the peers' rows from
// their frames; an instantiation of its own too.
// The bulk rows form (LOOP on bulk push) and the RS+AG rows form (SHARDS) also come with NV = 2:
// rows of 8192 in the 16 KiB tile the host sets for them (a row a tile, two vectors a thread of
// it, dc_norm_protocol_rows); their tiles, flags and waits are the plain call's in that tile,
// not the one-shot two-tile form's (whose row is two tiles of two blocks).
template <dc_u32 MODE, int W, int NV = 1, bool LOOP = false, bool SHARDS = false>
DC_DEV_NOINLINE void dc_collective_mode(const DcHeader& h, const DcSeg* seg, const DcNormPlan* norm) {
    static_assert(NV == 1 || (NV == 2 && (MODE != DC_MODE_PUSH || LOOP)),
                  "two vectors a row on one-shot, LL push and the row forms in the protocol only");
    static_assert(!LOOP || (MODE == DC_MODE_PULL && NV == 1) || MODE == DC_MODE_PUSH,
                  "the row loop on one-shot (rows of one tile) and the bulk rows form on bulk push");
    static_assert(!SHARDS || (MODE == DC_MODE_PULL && !LOOP), "the RS+AG rows form on RS+AG");
    const dc_u32 b = DC_BID;
    const bool member = b < h.grid;
    const dc_u64 own = h.ctl[h.rank];
    const dc_u64 own_data = h.data[h.rank];
    dc_u64* status = dc_at(own, h.off_status);
    DC_SHARED dc_u32 s_g;
    DC_SHARED int s_abort;
    DC_SHARED int s_refresh;
    // A one-block pull call of at most one 16-byte vector per thread (every small message)
    // loads its input into registers before the status loads below return, so the two round
    // trips overlap; the stores into the frame (whose parity needs the generation) follow.
    const bool quick_stage = MODE == DC_MODE_PULL && h.grid == 1u && h.nstage == 1u &&
                             seg[0].bytes <= 16ull * DC_NTID && ((seg[0].ptr | seg[0].frame_off | seg[0].bytes) & 15ull) == 0;
    const bool quick_mine = quick_stage && (dc_u64)DC_TID * 16u < seg[0].bytes;
    dc_u32x4 quick_v;
    if (quick_mine) quick_v = *(const dc_u32x4*)(seg[0].ptr + (dc_u64)DC_TID * 16u);
    // The host-preset refresh count as this call's prologue saw it: only this kernel's last
    // block (at its end) and the host (between calls) write it, so the end of the call counts
    // it down from this value instead of loading it again (a round trip at the kernel's end).
    dc_u64 refresh_left = 0;
    // A fused launch's row in registers (NV = 2, or DcNormPlan::row_in_regs): filled before and
    // by the protocol.
    DcNormRowRegs<NV> regs;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        regs.sum[k].x = regs.sum[k].y = regs.sum[k].z = regs.sum[k].w = 0u;
        regs.residual[k] = regs.weight[k] = regs.sum[k];
    }
    if (DC_TID == 0) {
        // Three independent loads, issued together (a load that waited for the generation
        // before it was issued cost a round trip per call).
        const dc_u64 abort_word = dc_ld_relaxed_sys(&status[DC_ST_ABORT]);
        const dc_u64 gen_word = dc_ld_relaxed_sys(&status[DC_ST_GEN]);
        const dc_u64 refresh_word = dc_ld_relaxed_sys(&status[DC_ST_REFRESH]);
        s_abort = abort_word != 0;
        s_g = (dc_u32)gen_word + 1u;
        s_refresh = (((dc_u32)gen_word + 1u) >> 1 & DC_LL_EPOCH_MASK) == 0u || refresh_word != 0;
        refresh_left = refresh_word;
    }
    DC_SYNC_BLOCK();
    // Into registers at once: nothing below reads the shared words again.
    const bool poisoned = s_abort != 0;
    const bool refresh = s_refresh != 0;
    const dc_u32 g = s_g;
    if (poisoned) return;  // later calls (e.g. already enqueued) touch nothing
    const bool push = MODE != DC_MODE_PULL;
    const dc_u64 frame = h.frame[g & 1u];
    const dc_u64 word = dc_flag_word(g, h.digest);

    if (member) {
        if (refresh && h.ll_slot != 0u) dc_ll_refresh<MODE == DC_MODE_PUSH_LL ? NV : 1, MODE == DC_MODE_PUSH_LL>(h, g);
        if (b == 0 && DC_TID == 0) {
            // The full signature first, so a peer that sees a mismatching digest can report it
            // (dc_fail re-reads it until its digest is the flag's: no fence needed here); then the
            // push headers, which an LL call's receivers wait on (other calls keep them fresh once
            // per epoch: a push rank facing a pull peer then learns of the mismatch from the pull
            // peer's failure, the pull peer from our ready flags).
            dc_u64* sig = dc_at(own, (g & 1u) ? h.off_sig1 : h.off_sig0);
            sig[0] = h.sig[0];
            sig[1] = h.sig[1];
            if (MODE == DC_MODE_PUSH_LL || refresh)
                for (dc_u32 q = 0; q < h.world; ++q)
                    if (q != h.rank)
                        dc_st_relaxed_sys(dc_at(h.ctl[q], h.off_push + ((g & 1u) * DC_MAX_WORLD + h.rank) * h.line),
                                          word);
        }
        if (b == 0 && refresh) {
            // Once per 2^30 generations (and when a test preset asks), every flag this call does
            // not use is rewritten with its word, so none ever falls 2^31 generations behind (a
            // flag that stale would read as Corrupt after the wrap): the pull ready flags of blocks
            // beyond the grid, the phase-2 flags of a one-phase call, and the bulk push flags this
            // call does not wait on, in every peer (they are the senders' to write). Safe: a peer
            // making this same call waits on none of them; one still at g - 1 reads g as "passed"
            // (our data of g - 1 is intact in the other frame); one making another call reads our
            // digest as a mismatch. (Every call did this until it showed as about 1 us per call at
            // 4 KiB and 20 % at 16 MiB on one H200: the barrier before a block's release made the
            // release wait for these system-scope stores too.)
            const dc_u32 used = push ? 0u : h.grid;
            for (dc_u32 k = used + DC_TID; k < h.layout_blocks; k += DC_NTID)
                dc_st_relaxed_sys(dc_at(own, h.off_ready + (dc_u64)k * h.line), word);
            for (dc_u32 k = (h.nphase2 && !push ? h.grid : 0u) + DC_TID; k < h.layout_blocks; k += DC_NTID)
                dc_st_relaxed_sys(dc_at(own, h.off_phase2 + (dc_u64)k * h.line), word);
            const bool bulk = MODE == DC_MODE_PUSH;
            const bool gathered = bulk && h.nstage > 0u && (seg[0].flags & DC_SEG_AG);
            for (dc_u32 k = 0; k < 2u; ++k) {
                const bool used = bulk && (k == 0u ? !gathered : (gathered || h.nphase2 > 0u));
                for (dc_u32 blk = (used ? h.grid : 0u) + DC_TID; blk < h.layout_blocks; blk += DC_NTID)
                    for (dc_u32 q = 0; q < h.world; ++q)
                        if (q != h.rank) dc_st_relaxed_sys(dc_pflag(h, q, k, blk, h.rank), word);
            }
        } else if (push && b == 0 && DC_TID == 0) {
            // A push call's word in the first pull flags: a pull peer making another call waits on
            // block 0's flags first, reads our digest as a mismatch and fails, and its other blocks
            // stop on its own abort word. One line each is enough for that, and the epoch refresh
            // above keeps the rest fresh.
            dc_st_relaxed_sys(dc_at(own, h.off_ready), word);
            dc_st_relaxed_sys(dc_at(own, h.off_phase2), word);
        }

        if (MODE == DC_MODE_PUSH_LL) {
            const bool row_in_regs = NV == 2 || (norm && norm->row_in_regs != 0u);
            if (row_in_regs) dc_norm_row_regs_load(*norm, regs);
            dc_push_ll<W, NV>(h, seg, status, g, row_in_regs, NV == 1 || norm->sum_is_y == 0u, regs.sum);
        } else if (MODE == DC_MODE_PUSH) {
            if constexpr (LOOP) {
                // The bulk rows form: the weight loads once, before the protocol's waits (the
                // thread's NV vectors, at the lanes of every row it takes).
#pragma unroll
                for (int k = 0; k < NV; ++k)
                    regs.weight[k] =
                        *(const dc_u32x4*)(norm->n.weight + 16u * (dc_u64)dc_row_weight_vector<NV>((dc_u32)k, norm->n.hidden));
                dc_push_bulk<W, true, NV>(h, seg, status, g, word, norm, &regs);
            } else {
                dc_push_bulk<W>(h, seg, status, g, word);
            }
        } else {
            // A fused launch's row form in registers: its residual and weight vectors load
            // while the staging and the wait below run. (The RS+AG rows form, also with two
            // vectors a thread, loads only the weight here: its rows' residuals load row by row.)
            const bool row_in_regs = (NV == 2 && !SHARDS) || LOOP || (norm && norm->row_in_regs != 0u);
            if (row_in_regs) dc_norm_row_regs_load(*norm, regs);
            if constexpr (SHARDS) {
#pragma unroll
                for (int k = 0; k < NV; ++k)
                    regs.weight[k] =
                        *(const dc_u32x4*)(norm->n.weight + 16u * (dc_u64)dc_row_weight_vector<NV>((dc_u32)k, norm->n.hidden));
            }
            // Stage this block's tiles of the input into the own frame.
            if (quick_mine) *(dc_u32x4*)(own_data + frame + seg[0].frame_off + (dc_u64)DC_TID * 16u) = quick_v;
            for (dc_u32 i = quick_stage ? h.nstage : 0u; i < h.nstage; ++i) {
                const DcSeg& s = seg[i];
                dc_for_tiles(s.frame_off, s.bytes, h.tile_bytes, h.grid, b, [&](dc_u64 lo, dc_u64 hi) {
                    dc_copy_range((dc_u8*)(own_data + frame + lo), (const dc_u8*)(s.ptr + (lo - s.frame_off)), hi - lo,
                                  DC_TID, DC_NTID);
                });
            }
            DC_SYNC_BLOCK();
            if (DC_TID == 0) {
                dc_u64* sig = dc_at(own, (g & 1u) ? h.off_sig1 : h.off_sig0);
                sig[0] = h.sig[0];
                sig[1] = h.sig[1];
                // Release: cumulative over the block's staging stores, ordered before it by the barrier.
                dc_st_release_sys(dc_at(own, h.off_ready + (dc_u64)b * h.line), word);
            }
            bool ok;
            if (NV == 2 && !SHARDS) {
                // Two tiles a row: block b < rows reduces row b, tiles 2b and 2b + 1, once the
                // ready flags of the blocks that staged them are up (tile t is block t % grid's:
                // with rows > grid / 2 blocks staged two tiles) in every peer and in this rank
                // too: the reduce reads the own leaf from the own frame, which other blocks of
                // this launch staged, and in place its stores of the row overwrite the input
                // those blocks stage from; no peer's flag orders either. A block without a row
                // still waits for its own line of every peer, as every block of the other bodies
                // does, then reduces nothing: with no row at all (an empty batch) no block would
                // otherwise wait, and the call would end before any peer had started it — its
                // next call could then restage the frame a late peer still reads, and it would
                // let dependent launches start (DC_GRID_DEP_TRIGGER) before the peers run.
                // (Not the RS+AG rows form with two vectors a thread: its row is one 16 KiB
                // tile, staged by the block itself, so it waits for its own flags like the
                // plain call.)
                if ((dc_u64)b < norm->n.rows) {
                    ok = dc_wait<true, true>(h, status, h.off_ready + ((2u * b) % h.grid) * h.line, g,
                                             DC_ERR_TIMEOUT_READY, false,
                                             h.off_ready + ((2u * b + 1u) % h.grid) * h.line);
                } else {
                    dc_wait(h, status, h.off_ready + b * h.line, g, DC_ERR_TIMEOUT_READY, false);
                    ok = false;
                }
            } else {
                ok = dc_wait(h, status, h.off_ready + b * h.line, g, DC_ERR_TIMEOUT_READY, false);
            }
            DC_GRID_DEP_TRIGGER();  // every peer is running this call (see dc_collective)
            if constexpr (LOOP && MODE == DC_MODE_PULL) {
                if (ok) dc_norm_rows_kept<W, NV>(h, seg[h.nstage], frame, *norm, regs);
            } else if constexpr (SHARDS) {
                // The RS+AG rows form: phase 1 and its flags as the plain call's (below), the
                // rows normalised where the plain call reduces and copies them.
                if (ok) {
                    dc_rsag_reduce_rows<W, NV>(h, seg[h.nstage], frame, *norm, regs);
                    DC_SYNC_BLOCK();
                    if (DC_TID == 0) dc_st_release_sys(dc_at(own, h.off_phase2 + (dc_u64)b * h.line), word);
                    if (dc_wait(h, status, h.off_phase2 + b * h.line, g, DC_ERR_TIMEOUT_PHASE2, false))
                        dc_rsag_norm_rows<NV>(h, seg, frame, *norm, regs);
                }
            } else if (ok && row_in_regs) {
                dc_reduce_row_kept_any<W, NV>(h, seg[h.nstage], frame, regs.sum, norm->sum_is_y == 0u, (dc_u64)b);
            } else if (ok) {
                for (dc_u32 i = 0; i < h.nphase1; ++i) {
                    const DcSeg& s = seg[h.nstage + i];
                    dc_run_segment<W>(h, s, frame, (s.flags & DC_SEG_GATHER) != 0);
                }
                if (h.nphase2) {
                    DC_SYNC_BLOCK();
                    if (DC_TID == 0) dc_st_release_sys(dc_at(own, h.off_phase2 + (dc_u64)b * h.line), word);
                    ok = dc_wait(h, status, h.off_phase2 + b * h.line, g, DC_ERR_TIMEOUT_PHASE2, false);
                    if (ok) {
                        for (dc_u32 i = 0; i < h.nphase2; ++i) {
                            const DcSeg& s = seg[h.nstage + h.nphase1 + i];
                            if ((s.flags & DC_SEG_NORM_READ) == 0u) dc_run_segment<W>(h, s, frame, true);
                        }
                    }
                }
            }
        }
    }  // member

    // (The row loop and the bulk rows form normalised their rows in the protocol, above; a
    // failed wait leaves them unwritten, as undefined as the sum of a failed call.)
    if (!LOOP && !SHARDS) {
        if (MODE != DC_MODE_PUSH && norm && (NV == 2 || norm->row_in_regs != 0u))
            dc_norm_row_in_regs_any<NV>(norm->n, regs, (dc_u64)DC_BID);
        else if (norm && dc_norm_epilogue(h, seg, status, g, refresh_left, *norm)) return;
    }
    if (!member) return;

    // The last block to finish ends the call (dc_call_ended). A block may finish before another
    // has started (its tiles need only its peers' blocks), so the generation may advance only
    // once every block has counted itself here, after its prologue read the generation. The
    // count orders nothing else (the readers of the words come after the launch), hence no
    // fences and no barrier of the block: thread 0 alone read the words and counts. A one-block
    // grid is its own last block: no count (about 0.8 us per call on one H200).
    if (DC_TID != 0) return;
    if (h.grid == 1u) {
        dc_call_ended(status, g, refresh_left);
        return;
    }
    const dc_u32 prev = DC_ATOMIC_ADD_U32(&status[DC_ST_FINISHED], 1u);
    if (prev == h.grid - 1u) {
        *(volatile dc_u32*)&status[DC_ST_FINISHED] = 0u;
        dc_call_ended(status, g, refresh_left);
    }
}

// The body of the call's protocol mode for world W: one out-of-line function per mode and
// world, so each is register-allocated for its own world's reductions alone. (With the worlds
// as a switch inside one body per mode, an image of every world gave that body a 416-byte stack
// frame of spills against 80 bytes for worlds 1/2/4/8, and LL push ran 6-34 % slower in
// graphs on one H200; benches/results/h200-2026-12-04-per-world-bodies.md.)
// `two_tile_rows`: the one-shot or LL push body for rows of two tiles in the row form (NV = 2).
// `rows_form`: 1, the one-shot body of the row loop, or the bulk push body of the bulk rows form
// (LOOP); 2, the RS+AG body of the RS+AG rows form (SHARDS); 3 and 4, the bulk rows form and the
// RS+AG rows form with two vectors a thread (NV = 2: rows of 8192 in the 16 KiB tile); 0, none.
template <int W>
DC_DEV void dc_collective_world(const DcHeader& h, const DcSeg* seg, const DcNormPlan* plan, bool two_tile_rows,
                                dc_u32 rows_form) {
    static_assert(W >= 2, "a world of one rank makes no collective launch");
    switch (h.mode) {
        case DC_MODE_PUSH_LL:
#if defined(DC_CUDA)
            if (two_tile_rows) {
                dc_collective_mode<DC_MODE_PUSH_LL, W, 2>(h, seg, plan);
                break;
            }
#endif
            dc_collective_mode<DC_MODE_PUSH_LL, W>(h, seg, plan);
            break;
        case DC_MODE_PUSH:
#if defined(DC_CUDA)
            if (rows_form == 1u) {
                dc_collective_mode<DC_MODE_PUSH, W, 1, true>(h, seg, plan);
                break;
            }
            if (rows_form == 3u) {
                dc_collective_mode<DC_MODE_PUSH, W, 2, true>(h, seg, plan);
                break;
            }
#endif
            dc_collective_mode<DC_MODE_PUSH, W>(h, seg, plan);
            break;
        default:
#if defined(DC_CUDA)
            if (two_tile_rows) {
                dc_collective_mode<DC_MODE_PULL, W, 2>(h, seg, plan);
                break;
            }
            if (rows_form == 1u) {
                dc_collective_mode<DC_MODE_PULL, W, 1, true>(h, seg, plan);
                break;
            }
            if (rows_form == 2u) {
                dc_collective_mode<DC_MODE_PULL, W, 1, false, true>(h, seg, plan);
                break;
            }
            if (rows_form == 4u) {
                dc_collective_mode<DC_MODE_PULL, W, 2, false, true>(h, seg, plan);
                break;
            }
#endif
            (void)two_tile_rows;
            (void)rows_form;
            dc_collective_mode<DC_MODE_PULL, W>(h, seg, plan);
            break;
    }
}

// The launch's entry: the body of the call's protocol mode for its world.
//
// Programmatic dependent launch (CUDA, sm_90+; the host sets the launch attribute): before
// touching any memory the call waits for the grids it depends on (the previous kernel on the
// stream may be writing this call's input, or be this rank's previous call, whose generation
// update the prologue reads). Each block triggers its dependents once it has seen every peer's
// first flag of this call: the dependents' blocks then start early and wait at their own
// DC_GRID_DEP_WAIT, hiding their launch. Triggering no earlier than that keeps them from taking
// the multiprocessors a peer sharing this GPU still needs to start this call (every peer's
// blocks are resident once they have published); a block that returns early triggers by ending.
//
// A fused launch (`norm`) first copies its norm's parameters and the epilogue's decisions into
// shared memory (thread 0, seen by every thread after the prologue's barrier), before the
// wait: in a programmatic launch that wait hides these reads of parameter space (the norm's
// parameters lie past the collective's, on lines nothing else touches), which otherwise fell
// on the call's critical path after the protocol (about 1 us per call at one row, measured on
// one H200 with clock64 probes in the epilogue).
DC_DEV void dc_collective(const DcHeader& h, const DcSeg* seg, const DcNormParams* norm = 0) {
    DC_SHARED DcNormPlan s_plan;
    if (norm && DC_TID == 0) dc_norm_prepare(h, seg, *norm, s_plan);
    const DcNormPlan* plan = norm ? &s_plan : (const DcNormPlan*)0;
    // Which body runs is every thread's own decision (the plan in shared memory is not yet
    // visible to them), from parameter space like the plan's: the same answer as its.
    // The row forms in the protocol: rows_form 1 (bulk) or 2 (RS+AG) with one vector a thread, 3
    // or 4 with two (dc_norm_bulk_rows and dc_norm_rsag_rows say how many; 0 on any other route).
    const bool two_tile_rows = norm && dc_norm_two_tile_rows(h, seg, *norm);
    // Asked one after the other, each only when the previous said no (the bulk and RS+AG forms
    // exclude each other by mode). The entry's stack frame is 208 bytes with the wide forms'
    // dispatch, 80 without (ptxas -v, sm_90, either way of asking): to be timed on a GPU.
    dc_u32 rows_form = 0u;
    if (norm) {
        if (dc_norm_row_loop(h, seg, *norm)) {
            rows_form = 1u;
        } else if (const dc_u32 bulk = dc_norm_bulk_rows(h, seg, *norm)) {
            rows_form = bulk == 1u ? 1u : 3u;
        } else if (const dc_u32 rsag = dc_norm_rsag_rows(h, seg, *norm)) {
            rows_form = rsag == 1u ? 2u : 4u;
        }
    }
    DC_GRID_DEP_WAIT();
    // Worlds with peers only: a world of one rank makes no collective launch (the engine copies
    // its input, ipc-engine's IpcCollective), so an image's world 1 (every run-time image has it,
    // for the tree kernel) carries no protocol bodies.
    switch (h.world) {
#define DC_CASE(w) case w: dc_collective_world<w>(h, seg, plan, two_tile_rows, rows_form); break;
        DC_FOR_PEER_WORLDS(DC_CASE)
#undef DC_CASE
        default: DC_UNSUPPORTED_WORLD();
    }
}

// ---------------------------------------------------------------------------------------------
// Fused tree W inputs -> 1 output, grid-stride. Used by the transport route (gathered ranks ->
// local tree) and the bandwidth bench. SOFT selects the software arithmetic (HIP's), so the
// NVIDIA tests can check it bit for bit too.
// ---------------------------------------------------------------------------------------------

template <int W, int DT, bool SOFT>
DC_DEV void dc_tree_kernel(const DcTreeParams& p) {
    const dc_u32 esz = DT == DC_F32 ? 4u : 2u;
    const dc_u64 bytes = p.count * esz;
    const dc_u8* src[W];
#pragma unroll
    for (int i = 0; i < W; ++i) src[i] = (const dc_u8*)p.in[i];
    dc_u8* dst = (dc_u8*)p.out;
    dc_u64 mis = p.out & 15u;
    bool vec = true;
#pragma unroll
    for (int i = 0; i < W; ++i) vec = vec && ((p.in[i] & 15u) == mis);
    dc_u64 head = vec ? ((16u - mis) & 15u) : bytes;
    if (head > bytes) head = bytes;
    dc_u64 nvec = vec ? (bytes - head) / 16u : 0;
    const dc_u64 tid = (dc_u64)DC_BID * DC_NTID + DC_TID;
    const dc_u64 nthreads = (dc_u64)DC_NBLOCKS * DC_NTID;
    // Vector body, two vectors per thread per iteration for memory-level parallelism.
    dc_u64 k = tid;
    for (; k + nthreads < nvec; k += 2 * nthreads) {
        dc_u32x4 a[W], c[W];
#pragma unroll
        for (int i = 0; i < W; ++i) {
            a[i] = *(const dc_u32x4*)(src[i] + head + k * 16u);
            c[i] = *(const dc_u32x4*)(src[i] + head + (k + nthreads) * 16u);
        }
        *(dc_u32x4*)(dst + head + k * 16u) = dc_tree_vec<W, DT, SOFT>(a);
        *(dc_u32x4*)(dst + head + (k + nthreads) * 16u) = dc_tree_vec<W, DT, SOFT>(c);
    }
    for (; k < nvec; k += nthreads) {
        dc_u32x4 a[W];
#pragma unroll
        for (int i = 0; i < W; ++i) a[i] = *(const dc_u32x4*)(src[i] + head + k * 16u);
        *(dc_u32x4*)(dst + head + k * 16u) = dc_tree_vec<W, DT, SOFT>(a);
    }
    // Scalar head and tail (the whole range when the pointers are not co-aligned).
    const dc_u64 tail = head + nvec * 16u;
    for (dc_u64 off = tid * esz; off < head; off += nthreads * esz) {
        dc_u32 v[W];
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = dc_load_elem<DT>(src[i] + off);
        dc_store_elem<DT>(dst + off, dc_tree_scalar<W, DT, SOFT>(v));
    }
    for (dc_u64 off = tail + tid * esz; off < bytes; off += nthreads * esz) {
        dc_u32 v[W];
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = dc_load_elem<DT>(src[i] + off);
        dc_store_elem<DT>(dst + off, dc_tree_scalar<W, DT, SOFT>(v));
    }
}

template <int DT, bool SOFT>
DC_DEV void dc_tree_w(const DcTreeParams& p) {
#define DC_CASE(w) case w: dc_tree_kernel<w, DT, SOFT>(p); break;
    switch (p.world) {
        DC_FOR_WORLDS(DC_CASE)
        default: DC_UNSUPPORTED_WORLD();
    }
#undef DC_CASE
}

template <bool SOFT>
DC_DEV void dc_tree_any(const DcTreeParams& p) {
    switch (p.dtype) {
        case DC_F32: dc_tree_w<DC_F32, SOFT>(p); break;
        case DC_F16: dc_tree_w<DC_F16, SOFT>(p); break;
        default: dc_tree_w<DC_BF16, SOFT>(p); break;
    }
}

#endif  // DETCOLL_PROTOCOL_H
