//! Walker's alias method (Vose's construction): O(n) build, O(1) draws.

use rand::{Rng as _, RngExt};

pub struct AliasTable {
    prob: Vec<f32>,
    alias: Vec<u32>,
}

impl AliasTable {
    /// `None` when there is nothing to draw (no entries or all weights zero).
    /// The weights are consumed: their buffer holds the scaled weights while the table is
    /// built, so that the build needs 8 bytes per entry besides the table's 8 (and its work
    /// lists' 4): at 2^24 nodes the negative table's build is 340 MB, not 670.
    pub fn new(weights: Vec<f64>) -> Option<AliasTable> {
        let mut scaled = weights;
        let n = scaled.len();
        let total: f64 = scaled.iter().sum();
        if n == 0 || total.is_nan() || total <= 0.0 || total.is_infinite() {
            return None;
        }
        assert!(n <= u32::MAX as usize, "alias table over 2^32 entries");
        for w in scaled.iter_mut() {
            *w = *w * n as f64 / total;
        }
        let mut prob = vec![1.0f32; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        // Entries below and above their share, as stacks of indices (an entry moves from the
        // second to the first at most once: each needs n entries at most, touched as used).
        let below = scaled.iter().filter(|&&x| x < 1.0).count();
        let (mut small, mut large) = (Vec::with_capacity(n), Vec::with_capacity(n - below));
        for (i, &x) in scaled.iter().enumerate() {
            if x < 1.0 {
                small.push(i as u32);
            } else {
                large.push(i as u32);
            }
        }
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            let (s, l) = (s as usize, l as usize);
            prob[s] = scaled[s] as f32;
            alias[s] = l as u32;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l as u32);
            }
        }
        Some(AliasTable { prob, alias })
    }

    /// Bytes of a table over `n` entries.
    pub fn bytes(n: u64) -> u64 {
        8 * n
    }

    pub fn len(&self) -> usize {
        self.prob.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prob.is_empty()
    }

    #[inline]
    pub fn sample(&self, rng: &mut super::Rng) -> usize {
        let r = rng.next_u64();
        let i = (((r >> 32) * self.prob.len() as u64) >> 32) as usize;
        let u = (r as u32 >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
        if u < self.prob[i] {
            i
        } else {
            self.alias[i] as usize
        }
    }
}

/// Uniform integer in `[0, n)`.
#[inline]
pub fn below(rng: &mut super::Rng, n: usize) -> usize {
    rng.random_range(0..n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_follow_the_weights() {
        let w = [1.0, 0.0, 3.0, 6.0];
        let t = AliasTable::new(w.to_vec()).unwrap();
        let mut rng = crate::sample::rng_for(1, 0, 0);
        let n = 200_000;
        let mut c = [0usize; 4];
        for _ in 0..n {
            c[t.sample(&mut rng)] += 1;
        }
        assert_eq!(c[1], 0, "zero weight never drawn");
        // chi-square with 2 degrees of freedom over the non-zero cells; 13.8 is p = 0.001
        let chi: f64 = [0, 2, 3]
            .iter()
            .map(|&i| {
                let e = n as f64 * w[i] / 10.0;
                (c[i] as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi < 13.8, "chi-square {chi}, counts {c:?}");
    }

    #[test]
    fn nothing_to_draw_is_none() {
        assert!(AliasTable::new(Vec::new()).is_none());
        assert!(AliasTable::new(vec![0.0, 0.0]).is_none());
    }
}
