//! A volume's bytes kept like a sparse file: blocks that hold only zeros are
//! not stored. A NoCloud seed image is mostly zeros (its 32 KiB system area,
//! the padding of every sector), so a host with 1,000 machines keeps about a
//! tenth of the bytes it would keep as one flat buffer per volume.

use std::collections::BTreeMap;

/// Bytes per stored block.
const BLOCK: usize = 512;

/// Bytes `0..len`, stored as the blocks that are not all zeros.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseBytes {
    len: u64,
    blocks: BTreeMap<u64, Box<[u8]>>,
}

impl SparseBytes {
    /// The length: one past the last byte ever written.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The bytes stored (not counting the zero blocks that are left out).
    #[cfg(test)]
    pub fn stored(&self) -> usize {
        self.blocks.len() * BLOCK
    }

    /// Writes `bytes` at `offset`, growing the length like a file write.
    pub fn write(&mut self, offset: u64, bytes: &[u8]) {
        let mut at = offset;
        let mut rest = bytes;
        while !rest.is_empty() {
            let index = at / BLOCK as u64;
            let within = (at % BLOCK as u64) as usize;
            let n = rest.len().min(BLOCK - within);
            let (chunk, after) = rest.split_at(n);
            match self.blocks.get_mut(&index) {
                Some(block) => {
                    block[within..within + n].copy_from_slice(chunk);
                    if block.iter().all(|b| *b == 0) {
                        self.blocks.remove(&index);
                    }
                }
                None if chunk.iter().any(|b| *b != 0) => {
                    let mut block = vec![0u8; BLOCK].into_boxed_slice();
                    block[within..within + n].copy_from_slice(chunk);
                    self.blocks.insert(index, block);
                }
                // Zeros over zeros: nothing to keep.
                None => {}
            }
            at += n as u64;
            rest = after;
        }
        self.len = self.len.max(offset + bytes.len() as u64);
    }

    /// The bytes `start..end` (`end` at most [`Self::len`]).
    pub fn read(&self, start: u64, end: u64) -> Vec<u8> {
        let end = end.min(self.len);
        let start = start.min(end);
        let mut out = vec![0u8; (end - start) as usize];
        let first = start / BLOCK as u64;
        let last = end.div_ceil(BLOCK as u64);
        for (index, block) in self.blocks.range(first..last) {
            let block_start = index * BLOCK as u64;
            let from = start.max(block_start);
            let to = end.min(block_start + BLOCK as u64);
            out[(from - start) as usize..(to - start) as usize]
                .copy_from_slice(&block[(from - block_start) as usize..(to - block_start) as usize]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sparse bytes read back exactly what a flat buffer written the same way holds.
    #[test]
    fn reads_back_what_a_flat_buffer_holds() {
        let mut sparse = SparseBytes::default();
        let mut flat: Vec<u8> = Vec::new();
        let writes: &[(u64, Vec<u8>)] = &[
            (0, vec![0; 3000]),
            (2048, b"CD001".to_vec()),
            (511, vec![7, 8]),
            (5000, vec![1; 1500]),
            (5100, vec![0; 600]),
            (40_000, b"user-data".to_vec()),
            (1, vec![0; 1]),
        ];
        for (offset, bytes) in writes {
            sparse.write(*offset, bytes);
            let end = *offset as usize + bytes.len();
            if flat.len() < end {
                flat.resize(end, 0);
            }
            flat[*offset as usize..end].copy_from_slice(bytes);
            assert_eq!(sparse.len(), flat.len() as u64);
            assert_eq!(sparse.read(0, sparse.len()), flat);
        }
        assert_eq!(sparse.read(510, 514), flat[510..514]);
        assert_eq!(sparse.read(5090, 5200), flat[5090..5200]);
        assert_eq!(sparse.read(39_999, 100_000), flat[39_999..]);
        assert!(sparse.stored() < flat.len() / 4, "{} of {}", sparse.stored(), flat.len());
    }

    /// A block overwritten with zeros is no longer stored.
    #[test]
    fn zeroed_blocks_are_dropped() {
        let mut sparse = SparseBytes::default();
        sparse.write(1024, &[9; 512]);
        assert_eq!(sparse.stored(), 512);
        sparse.write(1024, &[0; 512]);
        assert_eq!(sparse.stored(), 0);
        assert_eq!(sparse.len(), 1536);
        assert_eq!(sparse.read(0, 2000), vec![0; 1536]);
    }
}
