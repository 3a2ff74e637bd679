//! Frame authentication, an xpf extension (pfsync has none): with a shared key, every frame
//! carries a trailer after the pfsync frame (past `pfsync_header.len`, where a FreeBSD
//! receiver does not look) with the sender's creator id, a stream number, a sequence number
//! and an HMAC-SHA256 over the frame and the trailer, truncated to 128 bits.
//!
//! The sequence number is (sender's start time in seconds) << 32 | frame counter, so a
//! restarted sender starts above everything it sent before. The receiver keeps, per (creator,
//! stream), the highest number seen and a 64-frame window below it (the IPsec anti-replay
//! window, RFC 4303 3.4.3): a frame reordered within the window passes once, a replayed or
//! older one is refused.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const TRAILER_LEN: usize = 36;
const MAGIC: [u8; 4] = *b"XPFA";
const MAC_LEN: usize = 16;
/// Frames below the highest seen that can still arrive (reordering tolerated).
pub const WINDOW: u64 = 64;

#[derive(Clone)]
pub struct Key(Hmac<Sha256>);

impl Key {
    /// A key from the shared secret's bytes (at least 16).
    pub fn new(secret: &[u8]) -> Result<Key, String> {
        if secret.len() < 16 {
            return Err(format!("sync key is {} bytes; at least 16 are needed", secret.len()));
        }
        Ok(Key(Hmac::<Sha256>::new_from_slice(secret).map_err(|e| e.to_string())?))
    }
    fn mac(&self, frame: &[u8], head: &[u8]) -> [u8; MAC_LEN] {
        let mut m = self.0.clone();
        m.update(frame);
        m.update(head);
        let full = m.finalize().into_bytes();
        full[..MAC_LEN].try_into().unwrap()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// The sending side of one stream.
#[derive(Debug, Clone)]
pub struct Signer {
    key: Key,
    creatorid: u32,
    stream: u16,
    next: u64,
}

impl Signer {
    /// `epoch`: the sender's start time, seconds (any value that grows across restarts).
    pub fn new(key: Key, creatorid: u32, stream: u16, epoch: u32) -> Signer {
        Signer { key, creatorid, stream, next: (epoch as u64) << 32 }
    }
    /// Appends the trailer to `frame` (a complete pfsync frame).
    pub fn sign(&mut self, frame: &mut Vec<u8>) {
        let seq = self.next;
        self.next += 1;
        let at = frame.len();
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&self.creatorid.to_be_bytes());
        frame.extend_from_slice(&self.stream.to_be_bytes());
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&seq.to_be_bytes());
        let mac = self.key.mac(&frame[..at], &frame[at..]);
        frame.extend_from_slice(&mac);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No trailer, or not one of ours.
    Missing,
    /// The MAC does not match: forged or altered.
    Mac,
    /// Seen before, or older than the window.
    Replay,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    top: u64,
    /// Bit i: frame `top - i` was seen.
    seen: u64,
}

/// The receiving side: checks trailers and remembers what each stream sent.
#[derive(Debug, Clone)]
pub struct Verifier {
    key: Key,
    windows: hashbrown::HashMap<(u32, u16), Window>,
}

impl Verifier {
    pub fn new(key: Key) -> Verifier {
        Verifier { key, windows: hashbrown::HashMap::new() }
    }

    /// Checks the trailer that follows the pfsync frame `frame[..len]`; on success the frame's
    /// sequence number is recorded and cannot pass again.
    pub fn verify(&mut self, frame: &[u8], len: usize) -> Result<(), AuthError> {
        let t = frame.get(len..len + TRAILER_LEN).ok_or(AuthError::Missing)?;
        if t[..4] != MAGIC {
            return Err(AuthError::Missing);
        }
        let mac = self.key.mac(&frame[..len], &t[..TRAILER_LEN - MAC_LEN]);
        // Constant-time compare: the MAC must not leak through timing.
        let diff = mac.iter().zip(&t[TRAILER_LEN - MAC_LEN..]).fold(0u8, |d, (a, b)| d | (a ^ b));
        if diff != 0 {
            return Err(AuthError::Mac);
        }
        let creator = u32::from_be_bytes(t[4..8].try_into().unwrap());
        let stream = u16::from_be_bytes([t[8], t[9]]);
        let seq = u64::from_be_bytes(t[12..20].try_into().unwrap());
        let w = self.windows.entry((creator, stream)).or_default();
        if w.top == 0 && w.seen == 0 {
            *w = Window { top: seq, seen: 1 };
            return Ok(());
        }
        if seq > w.top {
            let shift = seq - w.top;
            w.seen = if shift >= 64 { 0 } else { w.seen << shift };
            w.seen |= 1;
            w.top = seq;
            return Ok(());
        }
        let back = w.top - seq;
        if back >= WINDOW || w.seen & (1 << back) != 0 {
            return Err(AuthError::Replay);
        }
        w.seen |= 1 << back;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new(b"0123456789abcdef-shared").unwrap()
    }

    #[test]
    fn a_signed_frame_passes_once_and_an_altered_one_never() {
        let mut s = Signer::new(key(), 7, 0, 100);
        let mut v = Verifier::new(key());
        let mut f = vec![1u8; 40];
        s.sign(&mut f);
        assert_eq!(f.len(), 40 + TRAILER_LEN);
        assert_eq!(v.verify(&f, 40), Ok(()));
        assert_eq!(v.verify(&f, 40), Err(AuthError::Replay));
        let mut g = vec![2u8; 40];
        s.sign(&mut g);
        g[3] ^= 1;
        assert_eq!(v.verify(&g, 40), Err(AuthError::Mac));
        g[3] ^= 1;
        g[40 + 15] ^= 1; // the sequence number
        assert_eq!(v.verify(&g, 40), Err(AuthError::Mac));
        assert_eq!(v.verify(&f[..40], 40), Err(AuthError::Missing));
        let other = Key::new(b"another key of 16+ bytes").unwrap();
        let mut h = vec![3u8; 40];
        Signer::new(other, 7, 0, 100).sign(&mut h);
        assert_eq!(v.verify(&h, 40), Err(AuthError::Mac));
    }

    #[test]
    fn reordering_within_the_window_passes_and_old_frames_do_not() {
        let mut s = Signer::new(key(), 7, 1, 100);
        let mut v = Verifier::new(key());
        let frames: Vec<Vec<u8>> = (0..100)
            .map(|i| {
                let mut f = vec![i as u8; 24];
                s.sign(&mut f);
                f
            })
            .collect();
        assert_eq!(v.verify(&frames[70], 24), Ok(()));
        assert_eq!(v.verify(&frames[69], 24), Ok(()));
        assert_eq!(v.verify(&frames[10], 24), Ok(())); // 60 behind: inside
        assert_eq!(v.verify(&frames[5], 24), Err(AuthError::Replay)); // 65 behind
        assert_eq!(v.verify(&frames[99], 24), Ok(()));
        assert_eq!(v.verify(&frames[69], 24), Err(AuthError::Replay));
    }

    #[test]
    fn a_restarted_sender_is_accepted_and_its_old_frames_are_not() {
        let mut v = Verifier::new(key());
        let mut old = Signer::new(key(), 7, 0, 100);
        let mut f1 = vec![0u8; 24];
        old.sign(&mut f1);
        let mut f2 = vec![0u8; 24];
        old.sign(&mut f2);
        assert_eq!(v.verify(&f2, 24), Ok(()));
        let mut new = Signer::new(key(), 7, 0, 101);
        let mut g = vec![0u8; 24];
        new.sign(&mut g);
        assert_eq!(v.verify(&g, 24), Ok(()));
        assert_eq!(v.verify(&f1, 24), Err(AuthError::Replay));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(Key::new(b"short").is_err());
    }
}
