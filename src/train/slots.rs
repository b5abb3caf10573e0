//! A batch's distinct remote rows, numbered in the order of their first reference.

use rustc_hash::FxHashMap;

use super::cache::Directory;

/// Largest key space kept as a table: 4 bytes per key (16 MiB), of which a rank touches only
/// the pages of the keys its batches reference.
const TABLE_KEYS: u64 = 1 << 22;

/// Row key (`node << 1 | matrix`) to the key's slot in the batch being planned, through the
/// cache's [`Directory`]. While the key space is small (graphs up to two million nodes) a table
/// indexed by the key: one read per reference, where the hash map's probe (every reference of a
/// batch, three quarters of them negatives) was 6% of the ranks' CPU time at 2 simulated nodes.
/// A hash map beyond.
pub(super) struct KeySlots(Directory);

impl KeySlots {
    /// Slots for keys below `key_space`.
    pub(super) fn new(key_space: u64) -> KeySlots {
        KeySlots(if key_space <= TABLE_KEYS {
            Directory::table(key_space)
        } else {
            Directory::Map(FxHashMap::default())
        })
    }

    /// The slot of `key`; a key not seen since the last [`KeySlots::clear`] gets `new()`.
    #[inline]
    pub(super) fn get_or_insert(&mut self, key: u64, new: impl FnOnce() -> u32) -> u32 {
        self.0.get(key).unwrap_or_else(|| {
            let s = new();
            self.0.insert(key, s);
            s
        })
    }

    /// Forget the batch's `keys` (every key inserted since the last clear; others are ignored).
    pub(super) fn clear(&mut self, keys: &[u64]) {
        for &k in keys {
            self.0.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_map_number_keys_alike_and_forget_them_on_clear() {
        for mut s in [
            KeySlots::new(64),
            KeySlots(Directory::Map(FxHashMap::default())),
        ] {
            let mut keys = Vec::new();
            for k in [5u64, 9, 5, 63, 9, 0] {
                s.get_or_insert(k, || {
                    keys.push(k);
                    keys.len() as u32 - 1
                });
            }
            assert_eq!(keys, [5, 9, 63, 0]);
            let slots: Vec<u32> = [0u64, 5, 9, 63]
                .iter()
                .map(|&k| s.get_or_insert(k, || unreachable!()))
                .collect();
            assert_eq!(slots, [3, 0, 1, 2]);
            assert_eq!(s.0.len(), 4);
            s.clear(&keys);
            assert_eq!(s.0.len(), 0);
            assert_eq!(s.get_or_insert(9, || 7), 7);
            s.clear(&[9]);
            assert_eq!(s.0.get(9), None);
        }
        assert!(matches!(KeySlots::new(TABLE_KEYS + 1).0, Directory::Map(_)));
    }
}
