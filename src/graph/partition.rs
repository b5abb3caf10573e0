//! Ownership: a pure function from node id to (rank, local row). Every rank builds the same
//! `Partitioner` from the same inputs and compares its fingerprint with the others before any
//! data moves, so a rank with a different view of the graph fails setup instead of corrupting rows.

use super::NodeId;

/// How nodes are spread over ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// Node `v` lives on rank `v % n` at row `v / n`: exact row balance, and edge balance in
    /// expectation whatever the id order (hubs do not cluster on one rank).
    Striped,
    /// Contiguous id ranges of equal size: keeps locality of id orders (BFS, community
    /// relabelings) at the risk of edge imbalance.
    Block,
}

impl std::str::FromStr for Scheme {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "striped" | "hash" => Ok(Scheme::Striped),
            "block" | "range" => Ok(Scheme::Block),
            _ => Err(format!(
                "unknown partition scheme '{s}' (use striped or block)"
            )),
        }
    }
}

/// The rank count as a divisor that divides by multiplying (the `strength_reduce` crate):
/// striped ownership divides every node id it looks up (each walk step, each row a batch
/// references), and a hardware division by a value known only at run time was 8% of the
/// sampling thread's time on one rank.
#[derive(Clone, Copy, Debug)]
struct Stride(strength_reduce::StrengthReducedU64);

impl PartialEq for Stride {
    fn eq(&self, other: &Stride) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for Stride {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitioner {
    scheme: Scheme,
    num_nodes: u64,
    ranks: usize,
    stride: Stride,
    /// For `Block`: the first node of each rank plus `num_nodes` at the end.
    bounds: Vec<u64>,
}

impl Partitioner {
    pub fn new(scheme: Scheme, num_nodes: u64, ranks: usize) -> Self {
        assert!(ranks > 0, "at least one rank");
        let n = ranks as u64;
        let bounds = match scheme {
            Scheme::Striped => Vec::new(),
            Scheme::Block => (0..=n)
                .map(|r| r * (num_nodes / n) + r.min(num_nodes % n))
                .collect(),
        };
        Partitioner {
            scheme,
            num_nodes,
            ranks,
            stride: Stride(strength_reduce::StrengthReducedU64::new(n)),
            bounds,
        }
    }

    pub fn num_nodes(&self) -> u64 {
        self.num_nodes
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    #[inline]
    pub fn owner(&self, v: NodeId) -> usize {
        debug_assert!(v < self.num_nodes);
        match self.scheme {
            Scheme::Striped => (v % self.stride.0) as usize,
            Scheme::Block => self.bounds.partition_point(|&b| b <= v) - 1,
        }
    }

    /// Row of `v` inside its owner's storage.
    #[inline]
    pub fn local_index(&self, v: NodeId) -> usize {
        match self.scheme {
            Scheme::Striped => (v / self.stride.0) as usize,
            Scheme::Block => (v - self.bounds[self.owner(v)]) as usize,
        }
    }

    /// (owner, row) in one call.
    #[inline]
    pub fn locate(&self, v: NodeId) -> (usize, usize) {
        debug_assert!(v < self.num_nodes);
        match self.scheme {
            Scheme::Striped => {
                let (row, owner) = strength_reduce::StrengthReducedU64::div_rem(v, self.stride.0);
                (owner as usize, row as usize)
            }
            Scheme::Block => (self.owner(v), self.local_index(v)),
        }
    }

    /// The node stored at `row` of `rank`.
    #[inline]
    pub fn global(&self, rank: usize, row: usize) -> NodeId {
        match self.scheme {
            Scheme::Striped => row as u64 * self.ranks as u64 + rank as u64,
            Scheme::Block => self.bounds[rank] + row as u64,
        }
    }

    /// Number of nodes `rank` owns.
    pub fn num_local(&self, rank: usize) -> usize {
        let (n, r) = (self.ranks as u64, rank as u64);
        match self.scheme {
            Scheme::Striped => (self.num_nodes / n + u64::from(r < self.num_nodes % n)) as usize,
            Scheme::Block => (self.bounds[rank + 1] - self.bounds[rank]) as usize,
        }
    }

    /// A stable 64-bit summary (FNV-1a) that all ranks compare before using the partition.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u64| {
            for b in x.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        };
        eat(self.scheme as u64);
        eat(self.num_nodes);
        eat(self.ranks as u64);
        for &b in &self.bounds {
            eat(b);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_node_has_one_owner_and_round_trips(n in 1u64..5000, ranks in 1usize..9, block in any::<bool>()) {
            let scheme = if block { Scheme::Block } else { Scheme::Striped };
            let p = Partitioner::new(scheme, n, ranks);
            let mut counts = vec![0usize; ranks];
            for v in 0..n {
                let (o, i) = p.locate(v);
                prop_assert!(o < ranks);
                prop_assert!(i < p.num_local(o));
                prop_assert_eq!(p.global(o, i), v);
                counts[o] += 1;
            }
            for (r, &c) in counts.iter().enumerate() {
                prop_assert_eq!(c, p.num_local(r));
            }
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "row balance {lo}..{hi}");
        }
    }

    proptest! {
        /// The multiplying divisor agrees with hardware division on ids of any size.
        #[test]
        fn striped_ids_of_any_size_divide_exactly(v in any::<u64>(), ranks in 1usize..100_000) {
            let p = Partitioner::new(Scheme::Striped, u64::MAX, ranks);
            let r = ranks as u64;
            prop_assert_eq!(p.locate(v), ((v % r) as usize, (v / r) as usize));
            prop_assert_eq!((p.owner(v), p.local_index(v)), p.locate(v));
        }
    }

    #[test]
    fn fingerprints_differ_when_views_differ() {
        let a = Partitioner::new(Scheme::Striped, 100, 4);
        assert_eq!(
            a.fingerprint(),
            Partitioner::new(Scheme::Striped, 100, 4).fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            Partitioner::new(Scheme::Striped, 101, 4).fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            Partitioner::new(Scheme::Block, 100, 4).fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            Partitioner::new(Scheme::Striped, 100, 3).fingerprint()
        );
    }
}
