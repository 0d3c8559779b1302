//! The deterministic byte pattern each stream carries, and the in-order verifier that
//! checks it: byte `i` of a stream depends on the stream's seed and on `i`, so a lost,
//! duplicated or reordered byte shows up as a mismatch at a known offset.

/// Which way a stream flows; the two directions of one connection carry different
/// patterns, so a byte reflected back to its sender is caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to server.
    ClientToServer,
    /// Server to client.
    ServerToClient,
}

impl Direction {
    /// Short name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Direction::ClientToServer => "c2s",
            Direction::ServerToClient => "s2c",
        }
    }
}

/// SplitMix64: spreads consecutive stream ids over the whole seed space.
const fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// An endless byte sequence of little-endian words, word `n` a hash of the seed
/// (stream id and direction) and `n`. Counter-based, not a recurrence: consecutive
/// words do not depend on each other, so generating runs at memory speed and never
/// limits the throughput a test measures.
#[derive(Clone, Debug)]
pub struct Pattern {
    seed: u64,
    counter: u64,
    /// Bytes of the current word not yet handed out (`word >> 8*(8-left)` first).
    word: u64,
    left: u32,
}

impl Pattern {
    /// The pattern of `stream` in `dir`.
    pub fn new(stream: u64, dir: Direction) -> Self {
        let d = match dir {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        };
        let seed = splitmix64(stream.wrapping_mul(2).wrapping_add(d));
        Self {
            seed,
            counter: 0,
            word: 0,
            left: 0,
        }
    }

    #[inline(always)]
    fn word_at(seed: u64, n: u64) -> u64 {
        let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
        z ^ (z >> 32)
    }

    #[inline(always)]
    fn next_word(&mut self) -> u64 {
        let w = Self::word_at(self.seed, self.counter);
        self.counter += 1;
        w
    }

    /// Fills `buf` with the next `buf.len()` bytes of the sequence.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        // Finish the partly used word first.
        while self.left > 0 && i < buf.len() {
            buf[i] = self.word as u8;
            self.word >>= 8;
            self.left -= 1;
            i += 1;
        }
        let rest = &mut buf[i..];
        let mut chunks = rest.chunks_exact_mut(8);
        let (seed, first) = (self.seed, self.counter);
        let mut n = 0;
        for chunk in &mut chunks {
            chunk.copy_from_slice(&Self::word_at(seed, first + n).to_le_bytes());
            n += 1;
        }
        self.counter = first + n;
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut w = self.next_word();
            for b in tail.iter_mut() {
                *b = w as u8;
                w >>= 8;
            }
            self.word = w;
            self.left = 8 - tail.len() as u32;
        }
    }
}

/// The first byte that differed from the pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset in the stream.
    pub offset: u64,
    /// The byte the pattern has there.
    pub expected: u8,
    /// The byte received.
    pub got: u8,
}

/// Checks received bytes against a [`Pattern`], in order.
#[derive(Debug)]
pub struct Verifier {
    pattern: Pattern,
    expected: Vec<u8>,
    offset: u64,
    first_mismatch: Option<Mismatch>,
}

impl Verifier {
    /// A verifier for `stream` in `dir`.
    pub fn new(stream: u64, dir: Direction) -> Self {
        Self {
            pattern: Pattern::new(stream, dir),
            expected: Vec::new(),
            offset: 0,
            first_mismatch: None,
        }
    }

    /// Checks the next bytes of the stream.
    pub fn feed(&mut self, got: &[u8]) {
        if self.expected.len() < got.len() {
            self.expected.resize(got.len(), 0);
        }
        let expected = &mut self.expected[..got.len()];
        self.pattern.fill(expected);
        if self.first_mismatch.is_none()
            && expected != got
            && let Some(i) = expected.iter().zip(got).position(|(a, b)| a != b)
        {
            self.first_mismatch = Some(Mismatch {
                offset: self.offset + i as u64,
                expected: expected[i],
                got: got[i],
            });
        }
        self.offset += got.len() as u64;
    }

    /// Bytes checked so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The first difference, if any.
    pub fn first_mismatch(&self) -> Option<Mismatch> {
        self.first_mismatch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(stream: u64, dir: Direction, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        Pattern::new(stream, dir).fill(&mut v);
        v
    }

    #[test]
    fn split_fill_equals_one_fill() {
        let whole = bytes(7, Direction::ClientToServer, 1000);
        let mut p = Pattern::new(7, Direction::ClientToServer);
        let mut parts = Vec::new();
        for n in [1, 3, 8, 13, 0, 64, 5, 906] {
            let mut b = vec![0; n];
            p.fill(&mut b);
            parts.extend_from_slice(&b);
        }
        assert_eq!(parts, whole);
    }

    #[test]
    fn streams_and_directions_differ() {
        let a = bytes(1, Direction::ClientToServer, 64);
        assert_ne!(a, bytes(2, Direction::ClientToServer, 64));
        assert_ne!(a, bytes(1, Direction::ServerToClient, 64));
        assert_ne!(bytes(0, Direction::ClientToServer, 64), vec![0; 64]);
    }

    #[test]
    fn verifier_accepts_the_pattern_in_any_chunking() {
        let data = bytes(3, Direction::ServerToClient, 4096);
        let mut v = Verifier::new(3, Direction::ServerToClient);
        for chunk in data.chunks(77) {
            v.feed(chunk);
        }
        assert_eq!(v.offset(), 4096);
        assert_eq!(v.first_mismatch(), None);
    }

    #[test]
    fn verifier_catches_loss_duplication_and_reordering() {
        let data = bytes(9, Direction::ClientToServer, 4096);
        let check = |bad: Vec<u8>| {
            let mut v = Verifier::new(9, Direction::ClientToServer);
            v.feed(&bad);
            v.first_mismatch().map(|m| m.offset)
        };
        // Loss of bytes 100..110.
        let lost = [&data[..100], &data[110..]].concat();
        assert_eq!(check(lost), Some(100));
        // Bytes 200..300 sent twice.
        let dup = [&data[..300], &data[200..]].concat();
        assert_eq!(check(dup), Some(300));
        // Two 512-byte chunks swapped.
        let swapped = [
            &data[..512],
            &data[1024..1536],
            &data[512..1024],
            &data[1536..],
        ]
        .concat();
        assert_eq!(check(swapped), Some(512));
    }
}
