//! Walker's alias method (Vose's construction): O(n) build, O(1) draws.

use rand::{Rng as _, RngExt};

pub struct AliasTable {
    prob: Vec<f32>,
    alias: Vec<u32>,
}

impl AliasTable {
    /// `None` when there is nothing to draw (no entries or all weights zero).
    pub fn new(weights: &[f64]) -> Option<AliasTable> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        if n == 0 || total.is_nan() || total <= 0.0 || total.is_infinite() {
            return None;
        }
        assert!(n <= u32::MAX as usize, "alias table over 2^32 entries");
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut prob = vec![1.0f32; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&i| scaled[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            prob[s] = scaled[s] as f32;
            alias[s] = l as u32;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        Some(AliasTable { prob, alias })
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
        let t = AliasTable::new(&w).unwrap();
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
        assert!(AliasTable::new(&[]).is_none());
        assert!(AliasTable::new(&[0.0, 0.0]).is_none());
    }
}
