//! State keys (pf's `pf_state_key`): protocol, two addresses and two ports in the orientation
//! of an inbound packet, and the interface for if-bound states (0 = floating).
//!
//! pf orients a key by direction: for a packet going `in`, `addr[0]` is its source; going `out`,
//! `addr[0]` is its destination. A reply in the opposite direction therefore builds the same
//! key, and a forwarded flow makes two states (one `in`, one `out`), as in pf.

use crate::table::Meta;
use xpf_wire::{Addr, PDesc};

/// Direction of a packet through an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dir {
    In = 0,
    Out = 1,
}

/// What the state table needs of a key.
pub trait Key: Copy + Eq + Default + core::fmt::Debug + Send + crate::region::Zeroable + 'static {
    /// The key of `pd` seen in direction `dir` on interface `kif` (0 for floating states).
    fn from_pdesc(pd: &PDesc, dir: Dir, kif: u16) -> Self;
    /// The key as 64-bit words, for hashing.
    fn hash_with(&self, seed: &Seed) -> u64;
    fn proto(&self) -> u8;
    fn addr(&self, i: usize) -> Addr;
    fn port(&self, i: usize) -> u16;
    fn kif(&self) -> u16;
    fn af(&self) -> u8;
    /// A key from its parts (addresses as `Addr`, IPv4 in the first four bytes): for states
    /// that arrive by sync.
    fn from_parts(proto: u8, addr: [Addr; 2], port: [u16; 2], kif: u16) -> Self;
    /// This key on interface `kif` (0: floating).
    fn on(&self, kif: u16) -> Self;

    /// What a translated state's side record holds besides TCP peers. An IPv4 state's line
    /// holds its stack key (the addresses and ports the translation changed, in the three
    /// words of its [`Meta`]), so that a translated packet reads one line as a plain one
    /// does; the meta moves to the side record. An IPv6 state's line has no room: the side
    /// record holds the stack key.
    type Aside: crate::region::Zeroable + core::fmt::Debug;
    /// Whether the line holds the stack key (see [`Key::Aside`]).
    const STACK_IN_LINE: bool;
    /// A new translated state's line words and side record part, from its stack key
    /// (which has this key's protocol and interface) and its meta.
    fn lend(stack: &Self, meta: Meta) -> (Meta, Self::Aside);
    /// The stack key of a translated state whose wire key is `self`, from its line words
    /// and (IPv6) its side record part, which IPv4 never asks for.
    fn stack_of<'a>(&self, line: &Meta, aside: impl FnOnce() -> &'a Self::Aside) -> Self
    where
        Self::Aside: 'a;
    /// A translated state's meta, wherever [`Key::lend`] put it.
    fn meta_of<'a>(line: &'a Meta, aside: &'a Self::Aside) -> &'a Meta;
    fn meta_of_mut<'a>(line: &'a mut Meta, aside: &'a mut Self::Aside) -> &'a mut Meta;
}

/// IPv4 key: 16 bytes, compared and hashed as two words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C, align(8))]
pub struct Key4 {
    pub addr: [[u8; 4]; 2], // 0..8
    pub port: [u16; 2],     // 8..12 (host order)
    pub proto: u8,          // 12
    pub _pad: u8,           // 13, always 0
    pub kif: u16,           // 14..16
}
const _: () = assert!(core::mem::size_of::<Key4>() == 16);

/// IPv6 key: 40 bytes, hashed as five words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C, align(8))]
pub struct Key6 {
    pub addr: [[u8; 16]; 2], // 0..32
    pub port: [u16; 2],      // 32..36
    pub proto: u8,           // 36
    pub _pad: u8,            // 37
    pub kif: u16,            // 38..40
}
const _: () = assert!(core::mem::size_of::<Key6>() == 40);

// SAFETY: keys are integers; all-zero is a (meaningless but valid) key.
unsafe impl crate::region::Zeroable for Key4 {}
unsafe impl crate::region::Zeroable for Key6 {}

/// The per-table hash seed. Keys come from the wire, so the hash is keyed: without a secret an
/// attacker could aim every flow at one row (hash flooding).
#[derive(Debug, Clone, Copy)]
pub struct Seed(pub [u64; 4]);

/// `N` bytes from the kernel's random source (getrandom(2), blocking until it is seeded).
/// Secrets (hash seeds, `modulate state`'s and syncookies' keys) come from here; there is no
/// weaker fallback: a machine that cannot give them stops the daemon with this message.
pub fn os_random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: getrandom writes at most N - got bytes into the rest of b.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr() as *mut libc::c_void, N - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            panic!("getrandom(2) failed: {e}; xpf takes its secrets from the kernel only");
        }
        got += n as usize;
    }
    b
}

impl Seed {
    /// A seed from the kernel's random source.
    pub fn random() -> Seed {
        let b: [u8; 32] = os_random();
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Seed([w(0) | 1, w(1), w(2), w(3)])
    }
    /// A fixed seed for tests and reproducible benches.
    pub const fn fixed(x: u64) -> Seed {
        Seed([
            x | 1,
            x ^ 0x9e37_79b9_7f4a_7c15,
            x.rotate_left(17) ^ 0xc2b2_ae3d_27d4_eb4f,
            x.rotate_left(41) ^ 0x1656_67b1_9e37_79f9,
        ])
    }
}

/// A multiply that folds the 128-bit product (the mixer of foldhash and wyhash).
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = (a as u128) * (b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline(always)]
fn words<const N: usize>(b: &[u8]) -> [u64; N] {
    let mut w = [0u64; N];
    for (i, x) in w.iter_mut().enumerate() {
        *x = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    }
    w
}

impl Key4 {
    #[inline(always)]
    fn as_bytes(&self) -> &[u8; 16] {
        // SAFETY: Key4 is repr(C), 16 bytes, no padding bytes (the pad is a field).
        unsafe { &*(self as *const Key4 as *const [u8; 16]) }
    }
}

impl Key6 {
    #[inline(always)]
    fn as_bytes(&self) -> &[u8; 40] {
        // SAFETY: Key6 is repr(C), 40 bytes, no implicit padding.
        unsafe { &*(self as *const Key6 as *const [u8; 40]) }
    }
}

#[inline(always)]
fn orient<A: Copy>(pd: &PDesc, dir: Dir, a: impl Fn(&Addr) -> A) -> ([A; 2], [u16; 2]) {
    match dir {
        Dir::In => ([a(&pd.src), a(&pd.dst)], [pd.sport, pd.dport]),
        Dir::Out => ([a(&pd.dst), a(&pd.src)], [pd.dport, pd.sport]),
    }
}

impl Key for Key4 {
    #[inline(always)]
    fn from_pdesc(pd: &PDesc, dir: Dir, kif: u16) -> Self {
        let (addr, port) = orient(pd, dir, |a| a.v4_bytes());
        Key4 { addr, port, proto: pd.proto, _pad: 0, kif }
    }
    // PERF: one 128-bit multiply; ~1 ns.
    #[inline(always)]
    fn hash_with(&self, s: &Seed) -> u64 {
        let [a, b] = words::<2>(self.as_bytes());
        fold_mul(fold_mul(a ^ s.0[0], b ^ s.0[1]), s.0[2])
    }
    fn proto(&self) -> u8 {
        self.proto
    }
    fn addr(&self, i: usize) -> Addr {
        Addr::v4(self.addr[i])
    }
    fn port(&self, i: usize) -> u16 {
        self.port[i]
    }
    fn kif(&self) -> u16 {
        self.kif
    }
    fn af(&self) -> u8 {
        4
    }
    fn from_parts(proto: u8, addr: [Addr; 2], port: [u16; 2], kif: u16) -> Self {
        Key4 { addr: [addr[0].v4_bytes(), addr[1].v4_bytes()], port, proto, _pad: 0, kif }
    }
    #[inline(always)]
    fn on(&self, kif: u16) -> Self {
        Key4 { kif, ..*self }
    }

    type Aside = Meta;
    const STACK_IN_LINE: bool = true;
    #[inline(always)]
    fn lend(stack: &Self, meta: Meta) -> (Meta, Meta) {
        let ports = stack.port[0] as u32 | (stack.port[1] as u32) << 16;
        let line =
            Meta { creation: u32::from_ne_bytes(stack.addr[0]), rule: u32::from_ne_bytes(stack.addr[1]), seq: ports };
        (line, meta)
    }
    #[inline(always)]
    fn stack_of<'a>(&self, line: &Meta, _: impl FnOnce() -> &'a Meta) -> Self {
        Key4 {
            addr: [line.creation.to_ne_bytes(), line.rule.to_ne_bytes()],
            port: [line.seq as u16, (line.seq >> 16) as u16],
            ..*self
        }
    }
    #[inline(always)]
    fn meta_of<'a>(_: &'a Meta, aside: &'a Meta) -> &'a Meta {
        aside
    }
    #[inline(always)]
    fn meta_of_mut<'a>(_: &'a mut Meta, aside: &'a mut Meta) -> &'a mut Meta {
        aside
    }
}

impl Key for Key6 {
    #[inline(always)]
    fn from_pdesc(pd: &PDesc, dir: Dir, kif: u16) -> Self {
        let (addr, port) = orient(pd, dir, |a| a.0);
        Key6 { addr, port, proto: pd.proto, _pad: 0, kif }
    }
    #[inline(always)]
    fn hash_with(&self, s: &Seed) -> u64 {
        let w = words::<5>(self.as_bytes());
        let h = fold_mul(w[0] ^ s.0[0], w[1] ^ s.0[1]);
        let h = fold_mul(h ^ w[2] ^ s.0[2], w[3] ^ s.0[3]);
        fold_mul(h ^ w[4], s.0[0] ^ s.0[2])
    }
    fn proto(&self) -> u8 {
        self.proto
    }
    fn addr(&self, i: usize) -> Addr {
        Addr(self.addr[i])
    }
    fn port(&self, i: usize) -> u16 {
        self.port[i]
    }
    fn kif(&self) -> u16 {
        self.kif
    }
    fn af(&self) -> u8 {
        6
    }
    fn from_parts(proto: u8, addr: [Addr; 2], port: [u16; 2], kif: u16) -> Self {
        Key6 { addr: [addr[0].0, addr[1].0], port, proto, _pad: 0, kif }
    }
    #[inline(always)]
    fn on(&self, kif: u16) -> Self {
        Key6 { kif, ..*self }
    }

    type Aside = Key6;
    const STACK_IN_LINE: bool = false;
    fn lend(stack: &Self, meta: Meta) -> (Meta, Key6) {
        (meta, *stack)
    }
    #[inline(always)]
    fn stack_of<'a>(&self, _: &Meta, aside: impl FnOnce() -> &'a Key6) -> Self {
        *aside()
    }
    fn meta_of<'a>(line: &'a Meta, _: &'a Key6) -> &'a Meta {
        line
    }
    fn meta_of_mut<'a>(line: &'a mut Meta, _: &'a mut Key6) -> &'a mut Meta {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd() -> PDesc {
        PDesc {
            src: Addr::v4([198, 18, 10, 1]),
            dst: Addr::v4([198, 19, 10, 1]),
            sport: 2000,
            dport: 3000,
            af: 4,
            proto: 17,
            ..Default::default()
        }
    }

    #[test]
    fn reply_builds_the_same_key() {
        let p = pd();
        let mut r = p;
        std::mem::swap(&mut r.src, &mut r.dst);
        std::mem::swap(&mut r.sport, &mut r.dport);
        assert_eq!(Key4::from_pdesc(&p, Dir::In, 0), Key4::from_pdesc(&r, Dir::Out, 0));
        assert_eq!(Key6::from_pdesc(&p, Dir::In, 0), Key6::from_pdesc(&r, Dir::Out, 0));
        // The same packet going out (forwarded) is another key: two states per forwarded flow.
        assert_ne!(Key4::from_pdesc(&p, Dir::In, 0), Key4::from_pdesc(&p, Dir::Out, 0));
    }

    #[test]
    fn hash_depends_on_every_field_and_seed() {
        let s = Seed::fixed(1);
        let k = Key4::from_pdesc(&pd(), Dir::In, 0);
        let h = k.hash_with(&s);
        let mut k2 = k;
        k2.kif = 3;
        assert_ne!(h, k2.hash_with(&s));
        k2 = k;
        k2.port[1] ^= 1;
        assert_ne!(h, k2.hash_with(&s));
        assert_ne!(h, k.hash_with(&Seed::fixed(2)));
    }
}
