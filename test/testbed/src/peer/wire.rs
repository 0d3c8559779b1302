//! What the peer's client and server say to each other besides the pattern: the
//! request header the client sends right after connect, and the verdict trailer the
//! server sends last.
//!
//! A connection carries: client → server `Header`; if it asks for one, server → client
//! [`GREETING`], which the client reads and sends back, and the server reads that
//! before it sends anything else (each side then has read all the other sent); then `c2s`
//! pattern bytes, then the client half-closes; server → client `s2c` pattern bytes (or,
//! in ping-pong mode, the echo of each message), then a `Trailer` with the server's
//! verdict on what it received, then the server closes.

use std::io::{self, Read};

/// "BYP1".
const MAGIC: u32 = 0x4259_5031;

/// The server's answer to a header that asks for a greeting, which the client sends back:
/// once each has read the other's, each side has read all the other sent and both are
/// paired (what a test that asserts every byte redirected waits for, instead of a
/// sleep).
pub const GREETING: [u8; 8] = *b"BYPGREET";

/// What the connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bulk bytes each way, both verified.
    Stream,
    /// The client sends `msg_size` bytes and waits for their echo, `c2s / msg_size`
    /// times.
    PingPong,
}

/// The client's request, first bytes on every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Stream or ping-pong.
    pub mode: Mode,
    /// Stream id: seeds both directions' patterns.
    pub stream: u64,
    /// Pattern bytes the client sends after the header.
    pub c2s: u64,
    /// Pattern bytes the server sends back (unused in ping-pong).
    pub s2c: u64,
    /// Size of each write (and, in ping-pong, of each message).
    pub msg_size: u32,
    /// The server's send rate in bytes per second; 0 is unlimited.
    pub rate: u64,
    /// The server answers the header with [`GREETING`] before anything else.
    pub greet: bool,
}

impl Header {
    /// Encoded size.
    pub const LEN: usize = 48;

    /// Little-endian encoding.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        let mode: u32 = match self.mode {
            Mode::Stream => 0,
            Mode::PingPong => 1,
        };
        b[4..8].copy_from_slice(&mode.to_le_bytes());
        b[8..16].copy_from_slice(&self.stream.to_le_bytes());
        b[16..24].copy_from_slice(&self.c2s.to_le_bytes());
        b[24..32].copy_from_slice(&self.s2c.to_le_bytes());
        b[32..36].copy_from_slice(&self.msg_size.to_le_bytes());
        b[36..40].copy_from_slice(&u32::from(self.greet).to_le_bytes());
        b[40..48].copy_from_slice(&self.rate.to_le_bytes());
        b
    }

    /// Decodes, or says why the bytes are not a header.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Self, String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if u32_at(0) != MAGIC {
            return Err(format!("bad magic {:#010x}", u32_at(0)));
        }
        let mode = match u32_at(4) {
            0 => Mode::Stream,
            1 => Mode::PingPong,
            m => return Err(format!("unknown mode {m}")),
        };
        let msg_size = u32_at(32);
        if msg_size == 0 {
            return Err("message size 0".into());
        }
        Ok(Self {
            mode,
            stream: u64_at(8),
            c2s: u64_at(16),
            s2c: u64_at(24),
            msg_size,
            rate: u64_at(40),
            greet: u32_at(36) != 0,
        })
    }

    /// Reads one header.
    pub fn read_from(r: &mut impl Read) -> io::Result<Self> {
        let mut b = [0u8; Self::LEN];
        r.read_exact(&mut b)?;
        Self::decode(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// The server's verdict on the client's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every byte arrived, in order, and nothing more.
    Ok,
    /// A byte differed at this offset.
    Mismatch(u64),
    /// The stream ended after this many bytes.
    Short(u64),
    /// Bytes arrived past the announced length.
    Extra(u64),
}

/// Last bytes from the server: its [`Verdict`].
pub struct Trailer;

impl Trailer {
    /// Encoded size.
    pub const LEN: usize = 16;

    /// Little-endian encoding.
    pub fn encode(v: Verdict) -> [u8; Self::LEN] {
        let (code, arg): (u64, u64) = match v {
            Verdict::Ok => (0, 0),
            Verdict::Mismatch(o) => (1, o),
            Verdict::Short(o) => (2, o),
            Verdict::Extra(o) => (3, o),
        };
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&code.to_le_bytes());
        b[8..16].copy_from_slice(&arg.to_le_bytes());
        b
    }

    /// Decodes.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Verdict, String> {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[0..8]);
        let code = u64::from_le_bytes(w);
        w.copy_from_slice(&b[8..16]);
        let arg = u64::from_le_bytes(w);
        match code {
            0 => Ok(Verdict::Ok),
            1 => Ok(Verdict::Mismatch(arg)),
            2 => Ok(Verdict::Short(arg)),
            3 => Ok(Verdict::Extra(arg)),
            c => Err(format!("unknown verdict code {c}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            mode: Mode::PingPong,
            stream: 0xdead_beef_0000_0001,
            c2s: 64 << 20,
            s2c: 1,
            msg_size: 65536,
            rate: 4 << 20,
            greet: true,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let quiet = Header { greet: false, ..h };
        assert_eq!(Header::decode(&quiet.encode()), Ok(quiet));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).is_err());
    }

    #[test]
    fn trailer_round_trip() {
        for v in [
            Verdict::Ok,
            Verdict::Mismatch(7),
            Verdict::Short(1 << 40),
            Verdict::Extra(3),
        ] {
            assert_eq!(Trailer::decode(&Trailer::encode(v)), Ok(v));
        }
    }
}
