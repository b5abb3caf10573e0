//! The transport boundary. Algorithms see only [`Comm`] (collectives) and [`Window`] (rows that
//! other ranks read one-sidedly); never MPI. Two implementations sit behind a closed enum so
//! generic parameters do not spread: `local` runs N ranks as threads of one process (most tests),
//! `mpi` uses MPI collectives and RMA windows (all raw `mpi::ffi` lives in `mpi.rs`).
//!
//! Every blocking call is registered with the [`Watchdog`], which ends the job when one takes
//! longer than `--comm-timeout`: a job never hangs on a rank that died or stopped calling.

pub mod local;
pub mod mpi;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reduction applied element-wise by the `all_reduce_*` collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// Bytes moved by the collectives of one rank since the start (for the metrics).
/// The training step this process is in (0 before training), set by the solver: the watchdog
/// names it when a collective does not complete.
pub static STEP: AtomicU64 = AtomicU64::new(0);

#[derive(Default, Debug)]
pub struct Traffic {
    pub sent: AtomicU64,
    pub received: AtomicU64,
}

impl Traffic {
    /// Bytes sent and received so far.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }
}

/// A new file of `len` zero bytes at `path`, mapped read-write and unlinked.
fn map_file(path: &std::path::Path, len: usize) -> crate::Result<memmap2::MmapMut> {
    use crate::error::Error;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    f.set_len(len as u64).map_err(|e| Error::io(path, e))?;
    // SAFETY: the file was just created (or truncated) by this rank for this run and is unlinked
    // right after: no other process or mapping changes it while the mapping lives.
    let map = unsafe { memmap2::MmapMut::map_mut(&f) }.map_err(|e| Error::io(path, e))?;
    std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    Ok(map)
}

/// Ask the kernel for transparent huge pages over the whole pages of `[base, base + len)`
/// before they are first touched: rows and adjacency are read at random, and at 2 MiB a page
/// the TLB covers gigabytes instead of megabytes. Best effort: where THP is off (or the memory
/// is shared memory without `shmem_enabled`), nothing changes.
pub fn advise_huge_pages(base: *mut u8, len: usize) {
    const PAGE: usize = 4096;
    let start = (base as usize).next_multiple_of(PAGE);
    let end = (base as usize).saturating_add(len) / PAGE * PAGE;
    if end > start {
        // SAFETY: the caller passes a range inside a live allocation of this process; the call
        // covers only its whole pages. MADV_HUGEPAGE changes no contents, only how pages are
        // backed, and its failure is harmless.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// The mapping of `/proc/self/smaps` (its text) that holds address `at`: its backing file
/// (empty for anonymous memory) and its bytes on huge pages (`AnonHugePages`,
/// `ShmemPmdMapped` and `FilePmdMapped`). `None` when no mapping holds `at`.
pub fn huge_bytes_at(smaps: &str, at: usize) -> Option<(String, u64)> {
    let mut found: Option<(String, u64)> = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        // A mapping's header: `start-end perms offset dev inode [path]`.
        if let Some((a, b)) = first.split_once('-') {
            let range = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16));
            if let (Ok(a), Ok(b)) = range {
                if found.is_some() {
                    break;
                }
                if (a..b).contains(&at) {
                    let path = words.nth(4).unwrap_or("").to_string();
                    found = Some((path, 0));
                }
                continue;
            }
        }
        if let Some((_, bytes)) = &mut found {
            if matches!(
                first,
                "AnonHugePages:" | "ShmemPmdMapped:" | "FilePmdMapped:"
            ) {
                let kb: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                *bytes += kb << 10;
            }
        }
    }
    found
}

/// Say once, on the rank that calls it, when a large window of rows (already touched) sits on
/// 4 KiB pages: rows read at random then miss the TLB on nearly every row, and on 2 MiB pages
/// GraphSAGE's steps ran 1.11x faster here (docs/tuning.md, "Huge pages"). Open MPI backs its
/// shared-memory windows with a file in `/dev/shm`, a tmpfs mounted `huge=never` by default.
pub fn hint_small_pages(base: *const u8, len: usize) {
    static SAID: AtomicBool = AtomicBool::new(false);
    const LARGE: usize = 64 << 20;
    if len < LARGE || SAID.load(Ordering::Relaxed) {
        return;
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    // The middle of the rows: their first page may share a mapping with memory not advised.
    let Some((path, 0)) = huge_bytes_at(&smaps, base as usize + len / 2) else {
        return;
    };
    SAID.store(true, Ordering::Relaxed);
    let fix = match path.rsplit_once('/') {
        Some((dir, _)) if !dir.is_empty() => format!(
            "its file is in {dir}: remount it with huge pages allowed (root: `mount -o \
             remount,huge=advise {dir}`) or point the MPI's backing directory at such a mount"
        ),
        _ => "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled: \
              `madvise` or `always` turns them on)"
            .to_string(),
    };
    let msg = format!(
        "{:.1} MiB of rows are on 4 KiB pages, which random reads miss in the TLB; {fix} \
         (docs/tuning.md, \"Huge pages\")",
        len as f64 / (1u64 << 20) as f64
    );
    log::warn!("{msg}");
}

/// `len` default values in memory advised for huge pages ([`advise_huge_pages`]) before the
/// values are written.
pub fn huge_vec<T: Clone + Default>(len: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_huge_pages(v.as_mut_ptr().cast(), len * std::mem::size_of::<T>());
    v.resize(len, T::default());
    v
}

/// Make room for `len` values in `v` in memory advised for huge pages, as [`huge_vec`]'s; its
/// values move there when it must grow.
pub fn reserve_huge<T>(v: &mut Vec<T>, len: usize) {
    if v.capacity() >= len {
        return;
    }
    let mut w: Vec<T> = Vec::with_capacity(len);
    advise_huge_pages(w.as_mut_ptr().cast(), len * std::mem::size_of::<T>());
    w.append(v);
    *v = w;
}

/// An exchange under way ([`Comm::post`]); [`Comm::collect`] ends it.
#[must_use = "a posted exchange must be collected"]
pub struct Posted(Option<mpi::Isends>, Channel);

/// Independent streams of split-phase exchanges: each keeps its own posting order, so an
/// exchange of one may be collected while another's is still in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// The trainer's row requests, answers and deltas.
    Rows = 0,
    /// The negative pool's draws.
    Pool = 1,
}

/// How many [`Channel`]s there are.
pub const CHANNELS: usize = 2;

/// Collectives over the ranks of one job.
pub enum Comm {
    Local(local::LocalComm),
    Mpi(mpi::MpiComm),
}

impl Comm {
    pub fn rank(&self) -> usize {
        match self {
            Comm::Local(c) => c.rank(),
            Comm::Mpi(c) => c.rank(),
        }
    }

    pub fn size(&self) -> usize {
        match self {
            Comm::Local(c) => c.size(),
            Comm::Mpi(c) => c.size(),
        }
    }

    /// Ranks on this rank's node (those a node-shared window spans): 1 in-process.
    pub fn node_size(&self) -> usize {
        match self {
            Comm::Local(_) => 1,
            Comm::Mpi(c) => c.node_size(),
        }
    }

    pub fn is_mpi(&self) -> bool {
        matches!(self, Comm::Mpi(_))
    }

    pub fn watchdog(&self) -> &Watchdog {
        match self {
            Comm::Local(c) => &c.watchdog,
            Comm::Mpi(c) => &c.watchdog,
        }
    }

    pub fn traffic(&self) -> &Traffic {
        match self {
            Comm::Local(c) => &c.traffic,
            Comm::Mpi(c) => &c.traffic,
        }
    }

    pub fn barrier(&self) {
        let _g = self.watchdog().enter("barrier");
        match self {
            Comm::Local(c) => c.barrier(),
            Comm::Mpi(c) => c.barrier(),
        }
    }

    /// Personalised all-to-all: `send[p]` goes to rank `p`; returns what each rank sent here.
    /// Byte counts are 64-bit; the MPI implementation splits exchanges into rounds so that no
    /// 32-bit count can overflow.
    pub fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        assert_eq!(send.len(), self.size(), "one send buffer per rank");
        let out = self.off_rank_bytes(&send);
        let _g = self.watchdog().enter("all_to_all_v");
        let recv = match self {
            Comm::Local(c) => c.all_to_all_v(send),
            Comm::Mpi(c) => c.all_to_all_v(send),
        };
        let t = self.traffic();
        t.sent.fetch_add(out, Ordering::Relaxed);
        t.received
            .fetch_add(self.off_rank_bytes(&recv), Ordering::Relaxed);
        recv
    }

    /// Bytes of per-rank buffers that cross to or from other ranks (what a rank hands itself
    /// crosses nothing: not counted).
    fn off_rank_bytes(&self, bufs: &[Vec<u8>]) -> u64 {
        let me = self.rank();
        bufs.iter()
            .enumerate()
            .filter(|&(r, _)| r != me)
            .map(|(_, b)| b.len() as u64)
            .sum()
    }

    /// A split-phase personalised exchange, first half: `send[p]` starts on its way to rank `p`
    /// and the rank works on. [`Comm::collect`] later returns what every rank posted here on
    /// channel `ch`, in posting order: every rank posts and collects the same number of times
    /// per channel, and at most a few exchanges are in flight. Unlike [`Comm::all_to_all_v`] no rank waits for the others to
    /// post: a rank ahead by one exchange runs on (the trainer's exchange with the row cache).
    pub fn post(&self, ch: Channel, send: Vec<Vec<u8>>) -> Posted {
        assert_eq!(send.len(), self.size(), "one send buffer per rank");
        let out = self.off_rank_bytes(&send);
        self.traffic().sent.fetch_add(out, Ordering::Relaxed);
        match self {
            Comm::Local(c) => {
                c.post(ch, send);
                Posted(None, ch)
            }
            Comm::Mpi(c) => Posted(Some(c.post(ch, send)), ch),
        }
    }

    /// The second half of [`Comm::post`]: what every rank posted here (indexed by rank), after
    /// this rank's own sends of `posted` have left.
    pub fn collect(&self, mut posted: Posted) -> Vec<Vec<u8>> {
        let recv = self.receive(&mut posted);
        self.complete(posted);
        recv
    }

    /// What every rank posted here in `posted`'s exchange (indexed by rank), without waiting
    /// for this rank's own sends: [`Comm::complete`] does, later. Large messages leave only as
    /// their receivers take them, so a rank that waits for its own sends at once waits for the
    /// slowest receiver; completing them an exchange later lets it run on.
    pub fn receive(&self, posted: &mut Posted) -> Vec<Vec<u8>> {
        let _g = self.watchdog().enter("collect");
        let recv = match (self, posted.0.as_mut()) {
            (Comm::Local(c), _) => c.collect(posted.1),
            (Comm::Mpi(c), Some(p)) => c.receive(posted.1, p),
            (Comm::Mpi(_), None) => unreachable!("an MPI exchange posts through MPI"),
        };
        self.traffic()
            .received
            .fetch_add(self.off_rank_bytes(&recv), Ordering::Relaxed);
        recv
    }

    /// Let this rank's sends of a received exchange move on (transports such as TCP send only
    /// while the rank is inside MPI) without waiting; whether they have all left.
    pub fn progress(&self, posted: &mut Posted) -> bool {
        match (self, posted.0.as_mut()) {
            (Comm::Mpi(c), Some(p)) => c.test(p),
            _ => true,
        }
    }

    /// Wait until this rank's own sends of a received exchange have left.
    pub fn complete(&self, posted: Posted) {
        let _g = self.watchdog().enter("collect");
        if let (Comm::Mpi(c), Some(p)) = (self, posted.0) {
            c.complete(p);
        }
    }

    /// Every rank's `data`, indexed by rank.
    pub fn all_gather_bytes(&self, data: &[u8]) -> Vec<Vec<u8>> {
        self.all_to_all_v(vec![data.to_vec(); self.size()])
    }

    pub fn all_reduce_u64(&self, v: &[u64], op: ReduceOp) -> Vec<u64> {
        let _g = self.watchdog().enter("all_reduce");
        match self {
            Comm::Mpi(c) => c.all_reduce_u64(v, op),
            Comm::Local(_) => {
                let parts = self.all_gather_bytes(&encode_u64(v));
                reduce(
                    parts.iter().map(|p| decode_u64(p)),
                    v.len(),
                    0u64,
                    |a, b| match op {
                        ReduceOp::Sum => a.wrapping_add(b),
                        ReduceOp::Max => a.max(b),
                        ReduceOp::Min => a.min(b),
                    },
                )
            }
        }
    }

    pub fn all_reduce_f64(&self, v: &[f64], op: ReduceOp) -> Vec<f64> {
        let _g = self.watchdog().enter("all_reduce");
        match self {
            Comm::Mpi(c) => c.all_reduce_f64(v, op),
            Comm::Local(_) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let parts = self.all_gather_bytes(&bytes);
                let decoded = parts.iter().map(|p| {
                    p.chunks_exact(8)
                        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect::<Vec<_>>()
                });
                reduce(decoded, v.len(), 0.0, |a, b| match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                })
            }
        }
    }

    /// Element-wise sum of `v` over the ranks, in place, the same on every rank (the dense
    /// sync of `--strategy replicated`). Counted as a ring all-reduce moves data: each rank
    /// sends and receives 2 (p - 1) / p of the vector's bytes.
    pub fn all_reduce_sum_f32(&self, v: &mut [f32]) {
        let p = self.size() as u64;
        if p == 1 {
            return;
        }
        {
            let _g = self.watchdog().enter("all_reduce");
            match self {
                Comm::Mpi(c) => c.all_reduce_sum_f32(v),
                Comm::Local(c) => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    let parts = c.all_to_all_v(vec![bytes; self.size()]);
                    // In rank order on every rank: the same sums everywhere.
                    v.iter_mut().for_each(|x| *x = 0.0);
                    for part in &parts {
                        for (x, b) in v.iter_mut().zip(part.chunks_exact(4)) {
                            *x += f32::from_le_bytes(b.try_into().expect("4 bytes"));
                        }
                    }
                }
            }
        }
        let ring = 2 * (p - 1) * (v.len() as u64 * 4) / p;
        let t = self.traffic();
        t.sent.fetch_add(ring, Ordering::Relaxed);
        t.received.fetch_add(ring, Ordering::Relaxed);
    }

    pub fn sum_u64(&self, x: u64) -> u64 {
        self.all_reduce_u64(&[x], ReduceOp::Sum)[0]
    }

    pub fn max_u64(&self, x: u64) -> u64 {
        self.all_reduce_u64(&[x], ReduceOp::Max)[0]
    }

    /// Collectively allocate a window of `local_bytes` on this rank (sizes may differ by rank).
    pub fn window(&self, local_bytes: usize) -> Window {
        self.allocate(local_bytes, false)
    }

    /// As [`Comm::window`], but the ranks of one node share their memory: each maps the
    /// others' bytes ([`Window::node_span`]). Under MPI with more than one rank per node
    /// (`MPI_Win_allocate_shared`); otherwise the same as `window`.
    pub fn node_window(&self, local_bytes: usize) -> Window {
        self.allocate(local_bytes, true)
    }

    /// This rank's part of [`Comm::window_over_map`]: a new file of `local_bytes` at `path`,
    /// mapped into memory and unlinked (its space returns when the job ends, even if it fails),
    /// or `None` where nothing is mapped (in-process ranks keep their bytes in memory; a rank
    /// without rows). Not collective: the caller agrees on the result before the window.
    pub fn map_window_file(
        &self,
        path: &std::path::Path,
        local_bytes: usize,
    ) -> crate::Result<Option<memmap2::MmapMut>> {
        match self {
            Comm::Mpi(_) if local_bytes > 0 => map_file(path, local_bytes).map(Some),
            _ => Ok(None),
        }
    }

    /// Collective: as [`Comm::window`], but the bytes are the file [`Comm::map_window_file`]
    /// mapped (`--mmap-rows`): the kernel writes its pages back and evicts them under memory
    /// pressure, so windows may exceed RAM. Every rank calls it once all have mapped their file.
    pub fn window_over_map(&self, map: Option<memmap2::MmapMut>, local_bytes: usize) -> Window {
        let _g = self.watchdog().enter("window allocation");
        match (self, map) {
            (Comm::Mpi(c), Some(m)) => Window::Mpi(c.window_over(m)),
            (Comm::Mpi(c), None) => Window::Mpi(c.window(0, false)),
            (Comm::Local(c), _) => Window::Local(c.window(local_bytes, false)),
        }
    }

    fn allocate(&self, local_bytes: usize, node_shared: bool) -> Window {
        let _g = self.watchdog().enter("window allocation");
        match self {
            Comm::Local(c) => Window::Local(c.window(local_bytes, node_shared)),
            Comm::Mpi(c) => Window::Mpi(c.window(local_bytes, node_shared)),
        }
    }

    /// End the whole job now (after a rank-local failure past setup). Never returns.
    pub fn abort(&self, code: i32) -> ! {
        match self {
            Comm::Local(_) => std::process::exit(code),
            Comm::Mpi(c) => c.abort(code),
        }
    }
}

fn reduce<T: Copy>(
    parts: impl Iterator<Item = Vec<T>>,
    n: usize,
    zero: T,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut acc: Option<Vec<T>> = None;
    for p in parts {
        assert_eq!(p.len(), n, "all ranks reduce vectors of one length");
        acc = Some(match acc {
            None => p,
            Some(a) => a.iter().zip(&p).map(|(&x, &y)| f(x, y)).collect(),
        });
    }
    acc.unwrap_or_else(|| vec![zero; n])
}

pub fn encode_u64(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn decode_u64(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Node ids in 4 bytes each when `narrow` (graphs of fewer than 2^32 nodes), else 8.
pub fn encode_ids(v: &[u64], narrow: bool) -> Vec<u8> {
    if !narrow {
        return encode_u64(v);
    }
    v.iter()
        .flat_map(|&x| {
            u32::try_from(x)
                .expect("a narrow id fits 4 bytes")
                .to_le_bytes()
        })
        .collect()
}

/// The ids of [`encode_ids`].
pub fn decode_ids(b: &[u8], narrow: bool) -> Vec<u64> {
    if !narrow {
        return decode_u64(b);
    }
    b.chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
        .collect()
}

/// Memory other ranks read one-sidedly: this rank's rows of a matrix. The owner reads and writes
/// its own part with plain loads and stores; readers may observe a row mid-update (HOGWILD).
pub enum Window {
    Local(local::LocalWindow),
    Mpi(mpi::MpiWindow),
}

/// The bytes of a node-shared window as this process maps them: every node rank's part, and
/// when all parts lie in one mapping (MPI shared memory) that mapping, which holds them at
/// `part - base`.
pub struct NodeSpan {
    pub mapping: Option<(*mut u8, usize)>,
    /// (world rank, its bytes, their length).
    pub parts: Vec<(usize, *mut u8, usize)>,
}

impl Window {
    /// Where this node's ranks' bytes are mapped, for a node-shared window with more than one
    /// rank on the node; `None` otherwise.
    pub fn node_span(&self) -> Option<NodeSpan> {
        match self {
            Window::Local(w) => w.node_span(),
            Window::Mpi(w) => w.node_span(),
        }
    }

    /// Make this rank's plain stores to its bytes visible to the node's other ranks (with a
    /// barrier after it).
    pub fn sync(&self) {
        match self {
            Window::Local(_) => {}
            Window::Mpi(w) => w.sync(),
        }
    }

    /// Run `f` over this rank's own bytes.
    pub fn with_local<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Window::Local(w) => w.with_local(f),
            Window::Mpi(w) => f(w.local()),
        }
    }

    /// Run `f` over this rank's own bytes, mutably (the owner applying updates).
    pub fn with_local_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match self {
            Window::Local(w) => w.with_local_mut(f),
            Window::Mpi(w) => {
                let r = f(w.local_mut());
                w.sync();
                r
            }
        }
    }

    /// Read `remote[owner] = [(tag, row)]` one-sidedly (rows `row_bytes` long) and hand each
    /// row's bytes to `take(tag, bytes)`, owner by owner in `remote`'s order. Returns the rows
    /// read.
    pub fn get_tagged(
        &self,
        watchdog: &Watchdog,
        remote: &[Vec<(u32, u32)>],
        row_bytes: usize,
        request_batch: usize,
        mut take: impl FnMut(u32, &[u8]),
    ) -> usize {
        let mut buf = Vec::new();
        let count = self.get_ordered(watchdog, remote, row_bytes, request_batch, &mut buf);
        for (&(tag, _), bytes) in remote.iter().flatten().zip(buf.chunks_exact(row_bytes)) {
            take(tag, bytes);
        }
        count
    }

    /// Read `remote[owner] = [(tag, row)]` one-sidedly into `buf` (replaced), owner by owner in
    /// `remote`'s order. Returns the rows read.
    pub fn get_ordered(
        &self,
        watchdog: &Watchdog,
        remote: &[Vec<(u32, u32)>],
        row_bytes: usize,
        request_batch: usize,
        buf: &mut Vec<u8>,
    ) -> usize {
        let wanted: Vec<Vec<u32>> = remote
            .iter()
            .map(|v| v.iter().map(|&(_, r)| r).collect())
            .collect();
        let requests: Vec<(usize, &[u32])> = wanted
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(o, v)| (o, v.as_slice()))
            .collect();
        let count: usize = requests.iter().map(|(_, v)| v.len()).sum();
        buf.clear();
        if count == 0 {
            return 0;
        }
        buf.resize(count * row_bytes, 0);
        self.get_rows(watchdog, &requests, row_bytes, request_batch, buf);
        count
    }

    /// Read rows `rows` (each `row_bytes` long, at `row * row_bytes`) of rank `owner` into `out`,
    /// `request_batch` rows per request. Returns when the data has arrived.
    pub fn get_rows(
        &self,
        watchdog: &Watchdog,
        requests: &[(usize, &[u32])],
        row_bytes: usize,
        request_batch: usize,
        out: &mut [u8],
    ) {
        let _g = watchdog.enter("one-sided row fetch");
        match self {
            Window::Local(w) => w.get_rows(requests, row_bytes, out),
            Window::Mpi(w) => w.get_rows(requests, row_bytes, request_batch.max(1), out),
        }
    }
}

/// Ends the job when a blocking communication call takes longer than the timeout.
/// A thread checks once a second; entering a call stamps the time, leaving clears it.
pub struct Watchdog {
    inner: Arc<WatchdogState>,
}

struct WatchdogState {
    started: Instant,
    /// Milliseconds since `started` at which the current call began; 0 when idle.
    since_ms: AtomicU64,
    what: std::sync::Mutex<&'static str>,
    timeout: Duration,
    stop: AtomicBool,
}

pub struct WatchGuard<'a>(&'a WatchdogState);

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        self.0.since_ms.store(0, Ordering::Release);
    }
}

impl Watchdog {
    /// Start watching; `on_timeout` gets a description and must end the process.
    pub fn start(
        rank: usize,
        timeout: Duration,
        on_timeout: impl Fn(&str) + Send + 'static,
    ) -> Watchdog {
        let inner = Arc::new(WatchdogState {
            started: Instant::now(),
            since_ms: AtomicU64::new(0),
            what: std::sync::Mutex::new(""),
            timeout,
            stop: AtomicBool::new(false),
        });
        let st = inner.clone();
        std::thread::Builder::new()
            .name(format!("watchdog-{rank}"))
            .spawn(move || {
                let tick =
                    Duration::from_millis(200).min(st.timeout / 4 + Duration::from_millis(1));
                while !st.stop.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    let since = st.since_ms.load(Ordering::Acquire);
                    if since == 0 {
                        continue;
                    }
                    let now = st.started.elapsed().as_millis() as u64;
                    if now.saturating_sub(since) > st.timeout.as_millis() as u64 {
                        let what = *st.what.lock().unwrap_or_else(|e| e.into_inner());
                        let step = STEP.load(Ordering::Relaxed);
                        let at = if step > 0 {
                            format!(" at training step {step}")
                        } else {
                            String::new()
                        };
                        on_timeout(&format!(
                            "rank {rank}{at}: {what} did not complete within --comm-timeout {}s \
                             (another rank failed or stopped); aborting the job",
                            st.timeout.as_secs_f64()
                        ));
                        return;
                    }
                }
            })
            .expect("spawn watchdog thread");
        Watchdog { inner }
    }

    pub fn enter(&self, what: &'static str) -> WatchGuard<'_> {
        *self.inner.what.lock().unwrap_or_else(|e| e.into_inner()) = what;
        let now = (self.inner.started.elapsed().as_millis() as u64).max(1);
        self.inner.since_ms.store(now, Ordering::Release);
        WatchGuard(&self.inner)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids come back as they went, in 4 bytes each when narrow and 8 otherwise.
    #[test]
    fn ids_round_trip_in_both_widths() {
        let ids = [0u64, 1, 77, u64::from(u32::MAX)];
        let b = encode_ids(&ids, true);
        assert_eq!(b.len(), 16);
        assert_eq!(decode_ids(&b, true), ids);
        let wide = [0u64, u64::from(u32::MAX) + 1, u64::MAX - 1];
        let b = encode_ids(&wide, false);
        assert_eq!(b.len(), 24);
        assert_eq!(decode_ids(&b, false), wide);
    }

    /// Growing into huge-page memory keeps the values and their order; room already there
    /// leaves the vector where it is.
    #[test]
    fn reserve_huge_moves_the_values_and_keeps_room_already_there() {
        let mut v: Vec<u32> = (0..1000).collect();
        reserve_huge(&mut v, 1 << 20);
        assert!(v.capacity() >= 1 << 20);
        assert_eq!(v, (0..1000).collect::<Vec<u32>>());
        let at = v.as_ptr();
        reserve_huge(&mut v, 5000);
        assert_eq!(v.as_ptr(), at);
        v.resize(1 << 20, 7);
        assert_eq!(v.as_ptr(), at);
        assert_eq!((v[999], v[1000]), (999, 7));
    }

    /// The mapping that holds an address is found in smaps' text, with its file and its bytes
    /// on huge pages summed over the three kinds; an address outside every mapping has none.
    #[test]
    fn smaps_names_the_mapping_and_its_huge_pages() {
        let smaps = "\
7f00-7f10 rw-p 00000000 00:00 0
Size:                 64 kB
AnonHugePages:      2048 kB
7f10-7f30 rw-s 00001000 00:1b 67554                      /dev/shm/osc_sm.vm.1 (deleted)
Size:                128 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
7f30-7f40 rw-s 00000000 00:1b 67555                      /dev/shm/seg
ShmemPmdMapped:     4096 kB
FilePmdMapped:      2048 kB
";
        assert_eq!(huge_bytes_at(smaps, 0x7f05), Some((String::new(), 2 << 20)));
        let shm = huge_bytes_at(smaps, 0x7f10).unwrap();
        assert_eq!(shm, ("/dev/shm/osc_sm.vm.1".to_string(), 0));
        assert_eq!(huge_bytes_at(smaps, 0x7f3f).unwrap().1, 6 << 20);
        assert_eq!(huge_bytes_at(smaps, 0x7f40), None);
        // This process's own smaps parses, and a live heap value is in some mapping.
        let own = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let x = Box::new(7u64);
        assert!(huge_bytes_at(&own, &*x as *const u64 as usize).is_some());
    }

    /// Huge-page-advised vectors hold their length of default values, at any size (below a
    /// page, unaligned, several 2 MiB pages).
    #[test]
    fn huge_vectors_are_zeroed_at_every_size() {
        for len in [0usize, 1, 1000, 3 << 20] {
            let v: Vec<u32> = huge_vec(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0), "len {len}");
        }
        // A range that holds no whole page is left alone.
        let mut b = [7u8; 100];
        advise_huge_pages(b.as_mut_ptr(), b.len());
        assert!(b.iter().all(|&x| x == 7));
    }
}
