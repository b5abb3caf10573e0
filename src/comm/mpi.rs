//! MPI transport: collectives through rsmpi, one-sided row reads through raw `mpi::ffi` RMA
//! (rsmpi has no window API). This is the only module with `unsafe` MPI calls.
//!
//! Windows are allocated with `MPI_Win_allocate` and opened once with `MPI_Win_lock_all`
//! (passive target) for their whole life. A *node-shared* window is allocated with
//! `MPI_Win_allocate_shared` on the ranks of one node (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`):
//! every rank of the node maps every other's rows (`MPI_Win_shared_query`), reads them with plain
//! copies and the trainer updates them in place; rows of other nodes are read through a second
//! window over the same memory (`MPI_Win_create` on the world), which exists only when the job
//! spans more than one node. A fetch issues one `MPI_Get` per owner and request
//! batch, with an `hindexed_block` datatype that picks the rows out of the owner's memory, then
//! flushes each target it read from (one flush per target: with MPICH 4.0.2 a single
//! `MPI_Win_flush_all` after many gets sometimes returned before the data arrived).
//!
//! The same source builds against Open MPI and the MPICH ABI family (MPICH, Cray MPICH, Intel
//! MPI, MVAPICH2); every integration suite runs under both (`make test-mpich`). What differs
//! between them and how it is handled here: docs/running.md, "MPI libraries and launchers".

use std::os::raw::c_int;
use std::ptr;
use std::time::Duration;

use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::ffi;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::{advise_huge_pages, Channel, ReduceOp, Traffic, Watchdog};

/// Largest number of bytes sent to one peer in one `MPI_Alltoallv` round: counts are `c_int`.
const DEFAULT_ROUND_BYTES: u64 = 1 << 30;

/// The first tag of split-phase exchanges (`post` / `collect`), one per [`Channel`]: each channel
/// is matched in its own posting order.
const EXCHANGE_TAG: c_int = 0x6773;

/// A real byte for empty sends.
static SPARE: [u8; 1] = [0];

/// Sends of a posted exchange: their requests, the buffers they read, and this rank's own.
pub struct Isends {
    reqs: Vec<ffi::MPI_Request>,
    bufs: Vec<Vec<u8>>,
    own: Vec<u8>,
}

impl Drop for Isends {
    /// An exchange never collected (a rank failing): MPI may still read the buffers, so they
    /// are leaked rather than freed.
    fn drop(&mut self) {
        if !self.reqs.is_empty() {
            std::mem::forget(std::mem::take(&mut self.bufs));
        }
    }
}

pub struct MpiComm {
    // Declared before `universe` so that it drops (and stops) before MPI is finalized.
    pub(super) watchdog: Watchdog,
    pub(super) traffic: Traffic,
    world: SimpleCommunicator,
    /// The ranks that share this rank's memory (its node), and their world ranks in node order.
    node: SimpleCommunicator,
    node_ranks: Vec<usize>,
    /// Whether some node has more than one rank (the same on every rank).
    shared_nodes: bool,
    /// Whether `MPI_Win_allocate` works (the same on every rank; see [`windows_work`]).
    windows: bool,
    round_bytes: u64,
    _universe: mpi::environment::Universe,
}

impl MpiComm {
    /// Initialise MPI (thread level MULTIPLE: the watchdog may call `MPI_Abort` from its thread).
    /// Returns `None` when MPI was already initialised.
    /// `per_node` groups ranks that many at a time into simulated nodes (`--ranks-per-node`);
    /// `None` groups the ranks of each machine.
    pub fn init(timeout: Duration, per_node: Option<usize>) -> Option<MpiComm> {
        let (universe, provided) = mpi::initialize_with_threading(mpi::Threading::Multiple)?;
        let world = universe.world();
        let rank = world.rank() as usize;
        if provided != mpi::Threading::Multiple {
            log::warn!("rank {rank}: MPI grants {provided:?}, not Multiple; the watchdog abort may misbehave");
        }
        let watchdog = Watchdog::start(rank, timeout, |msg| {
            log::error!("{msg}");
            eprintln!("graphscale: {msg}");
            abort_world(3);
        });
        // A test hook: small rounds exercise the round-splitting path with tiny exchanges.
        let round_bytes = std::env::var("GRAPHSCALE_A2A_ROUND_BYTES")
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&b: &u64| b > 0 && b <= DEFAULT_ROUND_BYTES)
            .unwrap_or(DEFAULT_ROUND_BYTES);
        // --ranks-per-node n groups ranks n by n into simulated "nodes", so that the paths for
        // rows and walkers of other nodes run on one machine.
        let node = match per_node.filter(|&n| n > 0) {
            Some(n) => world
                .split_by_color(mpi::topology::Color::with_value((rank / n) as c_int))
                .expect("every rank has a color"),
            None => world.split_shared(rank as c_int),
        };
        let mut node_ranks = vec![0u64; node.size() as usize];
        node.all_gather_into(&(rank as u64), &mut node_ranks[..]);
        let mut largest = 0i32;
        world.all_reduce_into(&node.size(), &mut largest, SystemOperation::max());
        let mut node_ranks: Vec<usize> = node_ranks.into_iter().map(|r| r as usize).collect();
        let windows = windows_work(&world, &world, false);
        let shared_nodes = windows && largest > 1 && windows_work(&world, &node, true);
        if windows && largest > 1 && !shared_nodes {
            // Without shared windows the ranks of a machine are as far apart as the ranks of
            // different machines (`--ranks-per-node 1`): that path is the same on any MPI.
            node_ranks = vec![rank];
            if rank == 0 {
                let msg = "MPI_Win_allocate_shared fails on this MPI (Open MPI given `--mca osc \
                           ucx` alone has no shared-memory windows: `--mca osc ucx,sm` keeps UCX \
                           for the one-sided reads and adds them): every rank keeps its rows and \
                           adjacency to itself and reaches the others' as another node's, as \
                           with --ranks-per-node 1";
                log::warn!("{msg}");
            }
        }
        Some(MpiComm {
            watchdog,
            traffic: Traffic::default(),
            world,
            node,
            node_ranks,
            shared_nodes,
            windows,
            round_bytes,
            _universe: universe,
        })
    }

    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    pub fn barrier(&self) {
        self.world.barrier();
    }

    pub fn node_size(&self) -> usize {
        self.node_ranks.len()
    }

    /// Whether this MPI allocates RMA windows (`MPI_Win_allocate`), which every job needs.
    pub fn windows_work(&self) -> bool {
        self.windows
    }

    pub fn abort(&self, code: i32) -> ! {
        abort_world(code)
    }

    pub fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        let n = self.size();
        // Every peer learns its length and the sender's longest buffer: the longest of all
        // (hence the number of rounds) is then known everywhere without another collective.
        let local_most = send.iter().map(|b| b.len() as u64).max().unwrap_or(0);
        let send_lens: Vec<u64> = send
            .iter()
            .flat_map(|b| [b.len() as u64, local_most])
            .collect();
        let mut got = vec![0u64; 2 * n];
        self.world.all_to_all_into(&send_lens[..], &mut got[..]);
        let recv_lens: Vec<u64> = got.iter().step_by(2).copied().collect();
        let most = got.iter().skip(1).step_by(2).copied().max().unwrap_or(0);
        let rounds = most.div_ceil(self.round_bytes).max(1);
        let mut recv: Vec<Vec<u8>> = recv_lens
            .iter()
            .map(|&l| Vec::with_capacity(l as usize))
            .collect();
        for round in 0..rounds {
            let piece = |len: u64| -> (u64, u64) {
                let start = (round * self.round_bytes).min(len);
                let end = ((round + 1) * self.round_bytes).min(len);
                (start, end)
            };
            // Never pass an empty u8 buffer: its dangling pointer is 0x1, which Open MPI reads as
            // MPI_IN_PLACE. One spare byte keeps the pointer real; counts exclude it.
            let mut sbuf = vec![0u8];
            let mut scounts = Vec::with_capacity(n);
            for b in &send {
                let (s, e) = piece(b.len() as u64);
                scounts.push((e - s) as c_int);
                sbuf.extend_from_slice(&b[s as usize..e as usize]);
            }
            let sbuf = &sbuf[1..];
            let rcounts: Vec<c_int> = recv_lens
                .iter()
                .map(|&l| {
                    let (s, e) = piece(l);
                    (e - s) as c_int
                })
                .collect();
            let sdispls = displacements(&scounts);
            let rdispls = displacements(&rcounts);
            let total: usize = rcounts.iter().map(|&c| c as usize).sum();
            let mut rbuf = vec![0u8; total + 1];
            {
                let sp = Partition::new(sbuf, &scounts[..], &sdispls[..]);
                let mut rp = PartitionMut::new(&mut rbuf[..], &rcounts[..], &rdispls[..]);
                self.world.all_to_all_varcount_into(&sp, &mut rp);
            }
            for (p, out) in recv.iter_mut().enumerate() {
                let d = rdispls[p] as usize;
                out.extend_from_slice(&rbuf[d..d + rcounts[p] as usize]);
            }
        }
        recv
    }

    /// Collective over the world (SPMD order): a window exposing `len` bytes at `base`, its
    /// passive-target epoch open.
    ///
    /// # Safety
    /// `base` must hold `len` bytes that stay valid until the returned window is freed.
    unsafe fn create_world_window(&self, base: *mut u8, len: usize) -> ffi::MPI_Win {
        let mut win: ffi::MPI_Win = unsafe_win_null();
        // SAFETY: the caller keeps `base..base + len` valid for the window's life; the world
        // communicator lives as long as `self`.
        let rc = unsafe {
            ffi::MPI_Win_create(
                base.cast(),
                len as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                self.world.as_raw(),
                &mut win,
            )
        };
        assert_eq!(rc, 0, "MPI_Win_create failed");
        // SAFETY: `win` was just created.
        unsafe { open_epoch(win) };
        win
    }

    /// A window over the world exposing `map` (a file mapping: `--mmap-rows`). Collective. A
    /// job of one rank has no reader of its rows and no window (Open MPI's default one-sided
    /// component at one rank refuses `MPI_Win_create` over a file mapping).
    pub fn window_over(&self, mut map: memmap2::MmapMut) -> MpiWindow {
        let (base, len) = (map.as_mut_ptr(), map.len());
        // SAFETY: `base` holds `len` bytes that stay mapped until the window is freed (the
        // window owns the mapping and frees itself first).
        let win = (self.size() > 1).then(|| unsafe { self.create_world_window(base, len) });
        MpiWindow {
            win,
            shm: None,
            base,
            len,
            rank: self.rank(),
            peers: Vec::new(),
            _mapping: Some(map),
        }
    }

    /// [`super::Comm::post`]: one `MPI_Isend` per other rank; this rank's own buffer waits in
    /// the handle.
    pub fn post(&self, ch: Channel, mut send: Vec<Vec<u8>>) -> Isends {
        let me = self.rank();
        let own = std::mem::take(&mut send[me]);
        let mut reqs = Vec::with_capacity(send.len());
        for (p, b) in send.iter().enumerate() {
            if p == me {
                continue;
            }
            let len = c_int::try_from(b.len()).unwrap_or_else(|_| {
                panic!(
                    "an exchange message of {} bytes to rank {p}: more than a 32-bit count holds; lower --batch-size",
                    b.len()
                )
            });
            // Never hand MPI a dangling pointer (an empty Vec's): point at a real byte.
            let ptr = if b.is_empty() {
                SPARE.as_ptr()
            } else {
                b.as_ptr()
            };
            // SAFETY: `RSMPI_REQUEST_NULL` is a plain constant handle.
            let mut r: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: `ptr` points at `len` readable bytes that stay where they are until the
            // request completes: the buffers move into the returned `Isends` (a Vec's heap
            // block does not move with it), and `collect` waits for every request before it
            // drops them. The communicator and datatype are valid handles.
            let rc = unsafe {
                ffi::MPI_Isend(
                    ptr.cast(),
                    len,
                    ffi::RSMPI_UINT8_T,
                    p as c_int,
                    EXCHANGE_TAG + ch as c_int,
                    self.world.as_raw(),
                    &mut r,
                )
            };
            assert_eq!(rc, 0, "MPI_Isend failed");
            reqs.push(r);
        }
        Isends {
            reqs,
            bufs: send,
            own,
        }
    }

    /// [`super::Comm::receive`]: the oldest message of every other rank on `ch` (matched probe,
    /// then a receive of its size); this rank's own sends may still be under way.
    pub fn receive(&self, ch: Channel, s: &mut Isends) -> Vec<Vec<u8>> {
        let me = self.rank();
        let mut recv = Vec::with_capacity(self.size());
        for p in 0..self.size() {
            if p == me {
                recv.push(std::mem::take(&mut s.own));
                continue;
            }
            let probed = self
                .world
                .process_at_rank(p as c_int)
                .matched_probe_with_tag(EXCHANGE_TAG + ch as c_int);
            let (v, _) = probed.matched_receive_vec::<u8>();
            recv.push(v);
        }
        recv
    }

    /// [`super::Comm::progress`]: let MPI move this rank's sends on without waiting; whether
    /// they have all left.
    pub fn test(&self, s: &mut Isends) -> bool {
        let mut flag: c_int = 0;
        // SAFETY: as in `complete`: requests `post` started (completed ones become null
        // handles), statuses ignored; the buffers stay alive in `s`.
        let rc = unsafe {
            ffi::MPI_Testall(
                s.reqs.len() as c_int,
                s.reqs.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        assert_eq!(rc, 0, "MPI_Testall failed");
        flag != 0
    }

    /// [`super::Comm::complete`]: wait for this rank's own sends of a posted exchange.
    pub fn complete(&self, mut s: Isends) {
        // SAFETY: `reqs` holds requests `post` started (or null ones); the statuses are
        // ignored. The send buffers are dropped with `s` only after this wait.
        let rc = unsafe {
            ffi::MPI_Waitall(
                s.reqs.len() as c_int,
                s.reqs.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        assert_eq!(rc, 0, "MPI_Waitall failed");
        s.reqs.clear();
    }

    pub fn all_reduce_u64(&self, v: &[u64], op: ReduceOp) -> Vec<u64> {
        let mut out = vec![0u64; v.len()];
        self.world.all_reduce_into(v, &mut out[..], system_op(op));
        out
    }

    pub fn all_reduce_f64(&self, v: &[f64], op: ReduceOp) -> Vec<f64> {
        let mut out = vec![0f64; v.len()];
        self.world.all_reduce_into(v, &mut out[..], system_op(op));
        out
    }

    /// In-place element-wise sum over the ranks, in pieces whose counts fit a C int.
    pub fn all_reduce_sum_f32(&self, v: &mut [f32]) {
        const PIECE: usize = 1 << 26;
        let mut send = Vec::with_capacity(v.len().min(PIECE));
        for chunk in v.chunks_mut(PIECE) {
            send.clear();
            send.extend_from_slice(chunk);
            self.world
                .all_reduce_into(&send[..], chunk, SystemOperation::sum());
        }
    }

    /// Collective: a window of `local_bytes` on this rank. With `node_shared` and more than one
    /// rank on some node, the node's ranks share their memory (see the module doc). The choice
    /// is the same on every rank: the world window below is created by all of them or none.
    pub fn window(&self, local_bytes: usize, node_shared: bool) -> MpiWindow {
        if !node_shared || !self.shared_nodes {
            let (win, base) = self.allocate(local_bytes);
            return MpiWindow {
                win: Some(win),
                shm: None,
                base,
                len: local_bytes,
                rank: self.rank(),
                peers: Vec::new(),
                _mapping: None,
            };
        }
        let mut base: *mut u8 = ptr::null_mut();
        let mut shm: ffi::MPI_Win = unsafe_win_null();
        // SAFETY: out-pointers are valid; the node communicator lives as long as `self`; the
        // call is collective over the node and every rank makes it in the same order (SPMD).
        // The default (contiguous) layout puts the node's segments in one mapping.
        let rc = unsafe {
            ffi::MPI_Win_allocate_shared(
                local_bytes as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                self.node.as_raw(),
                (&mut base as *mut *mut u8).cast(),
                &mut shm,
            )
        };
        assert_eq!(rc, 0, "MPI_Win_allocate_shared failed");
        // SAFETY: `shm` was just created.
        unsafe { open_epoch(shm) };
        let mut peers = Vec::with_capacity(self.node_ranks.len());
        for (i, &world) in self.node_ranks.iter().enumerate() {
            let (mut size, mut unit, mut at): (ffi::MPI_Aint, c_int, *mut u8) =
                (0, 0, ptr::null_mut());
            // SAFETY: `shm` is live; `i` is a rank of the node communicator; out-pointers valid.
            let rc = unsafe {
                ffi::MPI_Win_shared_query(
                    shm,
                    i as c_int,
                    &mut size,
                    &mut unit,
                    (&mut at as *mut *mut u8).cast(),
                )
            };
            assert_eq!(rc, 0, "MPI_Win_shared_query failed");
            peers.push(Peer {
                rank: world,
                base: at,
                len: if at.is_null() { 0 } else { size as usize },
            });
        }
        // SAFETY: MPI_Win_allocate_shared returned `local_bytes` bytes at `base`; no other rank
        // accesses them before the caller's next collective.
        unsafe { self.zero(base, local_bytes) };
        let win = (self.node_ranks.len() < self.size()).then(|| {
            // SAFETY: `base` holds `local_bytes` bytes that stay allocated until `shm` is freed,
            // after this window (Drop frees `win` first).
            unsafe { self.create_world_window(base, local_bytes) }
        });
        MpiWindow {
            win,
            shm: Some(shm),
            base,
            len: local_bytes,
            rank: self.rank(),
            peers,
            _mapping: None,
        }
    }

    /// Zero this rank's window bytes, advised for huge pages first; rank 0 says when a large
    /// window got none ([`super::hint_small_pages`]).
    ///
    /// # Safety
    /// `base` and `len` are what MPI_Win_allocate(_shared) returned for this rank (`len`
    /// writable bytes), and nobody else accesses them meanwhile.
    unsafe fn zero(&self, base: *mut u8, len: usize) {
        if len > 0 {
            advise_huge_pages(base, len);
            // SAFETY: the caller guarantees `len` writable, unshared bytes at `base`.
            unsafe { ptr::write_bytes(base, 0, len) };
        }
        if self.rank() == 0 {
            super::hint_small_pages(base, len);
        }
    }

    fn allocate(&self, local_bytes: usize) -> (ffi::MPI_Win, *mut u8) {
        let mut base: *mut u8 = ptr::null_mut();
        let mut win: ffi::MPI_Win = unsafe_win_null();
        // SAFETY: `base` and `win` are valid out-pointers; the communicator is MPI_COMM_WORLD's
        // handle, alive as long as `self`; `MPI_Win_allocate` is collective and every rank calls
        // `window` in the same order (the training setup is SPMD).
        let rc = unsafe {
            ffi::MPI_Win_allocate(
                local_bytes as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                self.world.as_raw(),
                (&mut base as *mut *mut u8).cast(),
                &mut win,
            )
        };
        assert_eq!(rc, 0, "MPI_Win_allocate failed");
        // SAFETY: `win` was just created; MPI_Win_allocate returned `local_bytes` bytes at
        // `base`, which no other rank reads before the caller's next collective.
        unsafe {
            open_epoch(win);
            self.zero(base, local_bytes);
        }
        (win, base)
    }
}

/// Open a passive-target epoch to every rank on a window, for its whole life (closed in
/// `MpiWindow`'s Drop).
///
/// # Safety
/// `win` is a window MPI has just created and nobody has freed.
unsafe fn open_epoch(win: ffi::MPI_Win) {
    // SAFETY: the caller guarantees a live window.
    let rc = unsafe { ffi::MPI_Win_lock_all(0, win) };
    assert_eq!(rc, 0, "MPI_Win_lock_all failed");
}

/// Collective: whether a small window can be allocated on `comm` on every rank of `world`:
/// with `MPI_Win_allocate_shared` (`shared`) or `MPI_Win_allocate`. Open MPI restricted to
/// `--mca osc ucx` (a common InfiniBand setting) has no component for shared windows and fails
/// that call with `MPI_ERR_INTERN`; `--mca osc rdma` over TCP fails `MPI_Win_allocate` with
/// `MPI_ERR_WIN`. Either would abort the job at its first window with MPI's own message; the
/// probe turns it into a choice (shared) or a clear error (`main`) before any window exists.
fn windows_work(world: &SimpleCommunicator, comm: &SimpleCommunicator, shared: bool) -> bool {
    let mut base: *mut u8 = ptr::null_mut();
    let mut win = unsafe_win_null();
    // SAFETY: `comm` is a live communicator and every rank of it makes these calls in the same
    // order (SPMD, at initialisation); the out-pointers are valid (`MPI_Comm_get_errhandler`
    // writes the handler before it is read). The error handler returns codes for the probe
    // only; the one before is restored and its reference freed; a window the probe made is
    // freed.
    let rc = unsafe {
        let mut before = std::mem::MaybeUninit::<ffi::MPI_Errhandler>::uninit();
        ffi::MPI_Comm_get_errhandler(comm.as_raw(), before.as_mut_ptr());
        let mut before = before.assume_init();
        ffi::MPI_Comm_set_errhandler(comm.as_raw(), ffi::RSMPI_ERRORS_RETURN);
        let out = (&mut base as *mut *mut u8).cast();
        let info = ffi::RSMPI_INFO_NULL;
        let rc = if shared {
            ffi::MPI_Win_allocate_shared(8, 1, info, comm.as_raw(), out, &mut win)
        } else {
            ffi::MPI_Win_allocate(8, 1, info, comm.as_raw(), out, &mut win)
        };
        if rc == 0 {
            ffi::MPI_Win_free(&mut win);
        }
        ffi::MPI_Comm_set_errhandler(comm.as_raw(), before);
        ffi::MPI_Errhandler_free(&mut before);
        rc
    };
    let mut failed = 0i32;
    world.all_reduce_into(&i32::from(rc != 0), &mut failed, SystemOperation::max());
    failed == 0
}

fn unsafe_win_null() -> ffi::MPI_Win {
    // SAFETY: RSMPI_WIN_NULL is an initialised constant exported by mpi-sys' C shim.
    unsafe { ffi::RSMPI_WIN_NULL }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

fn displacements(counts: &[c_int]) -> Vec<c_int> {
    let mut d = Vec::with_capacity(counts.len());
    let mut acc: c_int = 0;
    for &c in counts {
        d.push(acc);
        acc = acc
            .checked_add(c)
            .expect("a round's total bytes fit in c_int");
    }
    d
}

/// How long a failing rank waits between writing its message and `MPI_Abort`. The launcher
/// forwards the ranks' output through pipes and kills every rank on the abort; Hydra (MPICH's
/// `mpiexec`) was seen, once in four loaded runs of the fault suite, to end the job before it had
/// read the message that explained it. A fraction of a second lets it drain the pipe.
const ABORT_GRACE: Duration = Duration::from_millis(300);

/// Call `MPI_Abort` on `MPI_COMM_WORLD` from any thread (panic hook, watchdog, fatal errors),
/// after flushing stderr and a short grace for the launcher to forward it.
pub fn abort_world(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stderr().flush();
    std::thread::sleep(ABORT_GRACE);
    // SAFETY: MPI_Abort may be called at any time after MPI_Init by any thread when the library
    // grants THREAD_MULTIPLE; RSMPI_COMM_WORLD is a constant handle. If MPI is not initialised
    // we exit instead (checked first).
    unsafe {
        let mut flag: c_int = 0;
        ffi::MPI_Initialized(&mut flag);
        let mut fin: c_int = 0;
        ffi::MPI_Finalized(&mut fin);
        if flag != 0 && fin == 0 {
            ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code);
        }
    }
    std::process::exit(code)
}

/// One RMA window: this rank's bytes plus the handles to read other ranks' bytes.
pub struct MpiWindow {
    /// Over the world; `None` for a node-shared window of a job on one node.
    win: Option<ffi::MPI_Win>,
    /// The node-shared window, if any.
    shm: Option<ffi::MPI_Win>,
    base: *mut u8,
    len: usize,
    rank: usize,
    /// With a node-shared window: every rank of the node (this one included) and its bytes.
    peers: Vec<Peer>,
    /// A window over a file mapping (`--mmap-rows`) owns it; it is unmapped after the window is
    /// freed (fields drop after `Drop::drop`).
    _mapping: Option<memmap2::MmapMut>,
}

/// A rank of the node and where its window bytes are mapped in this process.
struct Peer {
    rank: usize,
    base: *mut u8,
    len: usize,
}

impl MpiWindow {
    pub fn local(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `base` points to `len` bytes allocated by MPI and owned by this window until
        // Drop. Other ranks read this memory concurrently, and with a node-shared window may
        // write it (HOGWILD, the documented contract; the trainer does so only between its
        // barriers, see `train`).
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }

    pub fn local_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `local`; `&mut self` guarantees no other Rust reference exists. Remote
        // MPI_Get may read concurrently: that is the documented HOGWILD contract.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// The node's bytes as one span of this process's memory, or `None` when the window is not
    /// node-shared.
    pub fn node_span(&self) -> Option<super::NodeSpan> {
        self.shm?;
        // The default (contiguous) MPI_Win_allocate_shared maps the node's parts in one region.
        let mapped = self.peers.iter().filter(|p| p.len > 0);
        let lo = mapped.clone().map(|p| p.base as usize).min();
        let hi = mapped.map(|p| p.base as usize + p.len).max();
        Some(super::NodeSpan {
            mapping: lo.zip(hi).map(|(lo, hi)| (lo as *mut u8, hi - lo)),
            parts: self.peers.iter().map(|p| (p.rank, p.base, p.len)).collect(),
        })
    }

    /// Make local stores visible to other ranks (separate memory model).
    pub fn sync(&self) {
        for w in self.win.iter().chain(&self.shm) {
            // SAFETY: `w` is a live window inside its lock_all epoch.
            unsafe { ffi::MPI_Win_sync(*w) };
        }
    }

    pub fn get_rows(
        &self,
        requests: &[(usize, &[u32])],
        row_bytes: usize,
        request_batch: usize,
        out: &mut [u8],
    ) {
        let total: usize = requests.iter().map(|(_, r)| r.len()).sum();
        assert!(out.len() >= total * row_bytes, "fetch buffer too small");
        let mut off = 0usize;
        let mut targets = Vec::new();
        let mut displs: Vec<ffi::MPI_Aint> = Vec::new();
        for &(owner, rows) in requests {
            let mapped = if owner == self.rank {
                Some((self.base, self.len))
            } else {
                self.peers
                    .iter()
                    .find(|p| p.rank == owner)
                    .map(|p| (p.base, p.len))
            };
            if let Some((base, len)) = mapped {
                for &r in rows {
                    let s = r as usize * row_bytes;
                    assert!(
                        s + row_bytes <= len,
                        "row {r} of rank {owner} is out of range"
                    );
                    // SAFETY: the row lies inside the owner's `len` mapped bytes (checked), and
                    // `out` has room (checked above). The owner may be writing it meanwhile
                    // (the HOGWILD contract, as with MPI_Get).
                    unsafe {
                        ptr::copy_nonoverlapping(
                            base.add(s),
                            out[off..off + row_bytes].as_mut_ptr(),
                            row_bytes,
                        )
                    };
                    off += row_bytes;
                }
                continue;
            }
            let win = self.win.expect("a rank off this node has a world window");
            for chunk in rows.chunks(request_batch) {
                displs.clear();
                displs.extend(
                    chunk
                        .iter()
                        .map(|&r| (r as usize * row_bytes) as ffi::MPI_Aint),
                );
                let bytes = chunk.len() * row_bytes;
                let mut dtype: ffi::MPI_Datatype = byte_type();
                // SAFETY: `displs` holds `chunk.len()` displacements, each inside the owner's
                // window (rows were validated against the owner's row count by the caller);
                // the new type is committed before use and freed after the flush below
                // (MPI defers the free until pending operations complete).
                unsafe {
                    ffi::MPI_Type_create_hindexed_block(
                        chunk.len() as c_int,
                        row_bytes as c_int,
                        displs.as_ptr(),
                        byte_type(),
                        &mut dtype,
                    );
                    ffi::MPI_Type_commit(&mut dtype);
                    ffi::MPI_Get(
                        out[off..off + bytes].as_mut_ptr().cast(),
                        bytes as c_int,
                        byte_type(),
                        owner as c_int,
                        0,
                        1,
                        dtype,
                        win,
                    );
                    ffi::MPI_Type_free(&mut dtype);
                }
                off += bytes;
            }
            targets.push(owner);
        }
        for t in targets {
            let win = self
                .win
                .expect("targets off this node imply a world window");
            // SAFETY: `win` is live and in a lock_all epoch; flushing completes the gets to `t`,
            // after which `out` holds their data.
            unsafe { ffi::MPI_Win_flush(t as c_int, win) };
        }
    }
}

fn byte_type() -> ffi::MPI_Datatype {
    // SAFETY: RSMPI_UINT8_T is an initialised constant exported by mpi-sys' C shim.
    unsafe { ffi::RSMPI_UINT8_T }
}

impl Drop for MpiWindow {
    fn drop(&mut self) {
        // The world window first: it may expose the shared window's memory.
        for w in self.win.iter_mut().chain(self.shm.iter_mut()) {
            // SAFETY: closes the epoch opened in `window` and frees the window; collective, and
            // windows are dropped in the same order on every rank (SPMD).
            unsafe {
                ffi::MPI_Win_unlock_all(*w);
                ffi::MPI_Win_free(w);
            }
        }
    }
}
