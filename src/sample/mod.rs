//! Samplers: alias tables, global negatives without a global table, random walks with walker
//! migration (DeepWalk, node2vec by rejection), and LINE edge sampling.

pub mod alias;
pub mod edges;
pub mod negatives;
pub mod neighbors;
pub mod walk;

use rand_xoshiro::Xoshiro256PlusPlus;

/// The one RNG used everywhere: fast, small state, splittable by seeding.
pub type Rng = Xoshiro256PlusPlus;

/// A stream for (`seed`, `rank`, `purpose`): independent, reproducible for a fixed rank count.
pub fn rng_for(seed: u64, rank: usize, purpose: u64) -> Rng {
    use rand::SeedableRng;
    let mix = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((rank as u64) << 32)
        .wrapping_add(purpose.wrapping_mul(0xD1B5_4A32_D192_ED03));
    Rng::seed_from_u64(mix)
}
