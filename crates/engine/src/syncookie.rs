//! `set syncookies never | always | adaptive (start N%, end M%)`: while cookies are on, a SYN
//! that the rules pass into a new state makes no state. The filter answers it with a SYN|ACK
//! whose sequence number is a cookie (a MAC of the connection, the client's number and the
//! MSS), and drops it. The client's ACK proves the cookie: the rules see the SYN it stands
//! for, the state is made there, and the handshake with the server goes on as `synproxy
//! state` does it (the ACK goes on as the SYN to the server; [`crate::synproxy`]). A spoofed
//! flood therefore fills no table: its sources never send the ACK.
//!
//! `adaptive` turns the cookies on when the TCP states whose handshake has not completed
//! (the tables' half-open count) reach `start`% of `set limit states`, and off when they
//! fall below `end`% (pf's watermarks; by default 25% and half of it).
//!
//! The cookie (32 bits, the initial number of the SYN|ACK): bits 0-2 the MSS's index in
//! [`MSS`], bit 3 the key's parity, bits 4-31 a SipHash-2-4 MAC of the addresses, ports,
//! the client's initial number and bits 0-3, under the key of a 15-second epoch. A cookie
//! is good in its epoch and the next (15 to 30 s). The epoch keys are derived from one
//! secret from getrandom that every worker shares, so that an ACK proves a cookie whichever
//! worker sent it. The SYN|ACK offers neither window scaling nor SACK (the cookie has no room
//! for them, and `synproxy state` offers neither): the connection runs without them.

use siphasher::sip::SipHasher24;
use siphasher::sip128::{Hasher128, SipHasher24 as Sip128};
use std::hash::Hasher;
use xpf_wire::PDesc;

/// The MSS values a cookie can carry (FreeBSD's and pf's table): the largest not above
/// what the client offered is announced.
pub const MSS: [u16; 8] = [216, 536, 1200, 1360, 1400, 1440, 1452, 1460];

/// Seconds a key is the current one.
pub const EPOCH: u32 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// pf's default.
    #[default]
    Never,
    Always,
    /// On at `start`% of the state limit in half-open TCP states, off below `end`%.
    Adaptive {
        start: u8,
        end: u8,
    },
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Never => "never",
            Mode::Always => "always",
            Mode::Adaptive { .. } => "adaptive",
        }
    }
}

/// A worker's cookies: the mode, whether they are on, and the two epoch keys in use.
#[derive(Debug, Clone)]
pub struct Cookies {
    mode: Mode,
    active: bool,
    /// The secret every worker shares; epoch keys are derived from it.
    secret: [u8; 32],
    /// Key of the even and the odd epoch, each with its epoch.
    keys: [(u32, [u8; 16]); 2],
    /// Last second a cookie was sent (ACKs are checked for cookies only within two epochs of
    /// it: without cookies out, a stray ACK costs no MAC).
    last_sent: Option<u32>,
    pub counters: Counters,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// SYN|ACKs sent with a cookie.
    pub sent: u64,
    /// ACKs that proved a cookie (each made a state, or met a blocking rule).
    pub valid: u64,
    /// ACKs without state while cookies were out whose cookie did not verify.
    pub invalid: u64,
    /// Times `adaptive` turned the cookies on (pf's "synfloods detected").
    pub floods: u64,
}

impl Cookies {
    pub fn new(secret: [u8; 32]) -> Cookies {
        Cookies {
            mode: Mode::Never,
            active: false,
            secret,
            keys: [(u32::MAX, [0; 16]); 2],
            last_sent: None,
            counters: Counters::default(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn set_mode(&mut self, m: Mode) {
        self.mode = m;
        self.active = m == Mode::Always;
    }

    /// Whether a SYN gets a cookie now.
    #[inline]
    pub fn active(&self) -> bool {
        self.active
    }

    /// `adaptive`: turns the cookies on or off by the half-open count (once per batch that
    /// has a miss; cheap).
    #[inline]
    pub fn watch(&mut self, halfopen: u32, limit: u32) {
        if let Mode::Adaptive { start, end } = self.mode {
            let (hi, lo) = (limit as u64 * start as u64 / 100, limit as u64 * end as u64 / 100);
            let h = halfopen as u64;
            if !self.active && h >= hi.max(1) {
                self.active = true;
                self.counters.floods += 1;
            } else if self.active && h < lo {
                self.active = false;
            }
        }
    }

    /// Whether an ACK without a state may carry a cookie (one was sent lately).
    #[inline]
    pub fn maybe(&self, now: u32) -> bool {
        self.last_sent.is_some_and(|t| now.wrapping_sub(t) <= 2 * EPOCH)
    }

    fn key(&mut self, epoch: u32) -> [u8; 16] {
        let slot = &mut self.keys[(epoch & 1) as usize];
        if slot.0 != epoch {
            let mut h = Sip128::new_with_key(self.secret[..16].try_into().expect("16 bytes"));
            h.write(&self.secret[16..]);
            h.write_u32(epoch);
            *slot = (epoch, h.finish128().as_bytes());
        }
        slot.1
    }

    fn mac(&mut self, pd: &PDesc, isn: u32, low: u32, epoch: u32) -> u32 {
        let k = self.key(epoch);
        let mut h = SipHasher24::new_with_key(&k);
        h.write_u8(pd.af);
        h.write(&pd.src.0);
        h.write(&pd.dst.0);
        h.write_u16(pd.sport);
        h.write_u16(pd.dport);
        h.write_u32(isn);
        h.write_u32(low);
        h.finish() as u32
    }

    /// The cookie for the SYN `pd` (the client's initial number `pd.tcp_seq`) offering
    /// `mss` (None: none offered, RFC 9293's default for the family: 536, or 1,220 for IPv6),
    /// at `now`; with the MSS it announces.
    pub fn make(&mut self, pd: &PDesc, offered: Option<u16>, now: u32) -> (u32, u16) {
        let want = offered.unwrap_or(if pd.af == xpf_wire::pdesc::AF_INET6 { 1220 } else { 536 });
        let idx = MSS.iter().rposition(|&m| m <= want).unwrap_or(0) as u32;
        let epoch = now / EPOCH;
        let low = idx | (epoch & 1) << 3;
        let mac = self.mac(pd, pd.tcp_seq, low, epoch);
        self.last_sent = Some(now);
        self.counters.sent += 1;
        ((mac & !0xf) | low, MSS[idx as usize])
    }

    /// The ACK `pd` (no state matched it) against the cookie it acknowledges: Some(the
    /// MSS the cookie announced) when it proves one made in this epoch or the last.
    pub fn check(&mut self, pd: &PDesc, now: u32) -> Option<u16> {
        let iss = pd.tcp_ack.wrapping_sub(1);
        let low = iss & 0xf;
        let epoch = now / EPOCH;
        let epoch = if (epoch & 1) == (low >> 3) { epoch } else { epoch.checked_sub(1)? };
        let mac = self.mac(pd, pd.tcp_seq.wrapping_sub(1), low, epoch);
        if mac & !0xf == iss & !0xf {
            self.counters.valid += 1;
            Some(MSS[(low & 7) as usize])
        } else {
            self.counters.invalid += 1;
            None
        }
    }
}

/// The SYN an ACK that proved a cookie answers, as the rules are to see it: the client's
/// initial number, no acknowledgement, no payload; addresses, ports and the rest as the ACK's.
pub fn recreate(ack: &PDesc) -> PDesc {
    let payload = ack.payload_len;
    PDesc {
        tcp_flags: xpf_wire::tcp::SYN,
        tcp_seq: ack.tcp_seq.wrapping_sub(1),
        tcp_ack: 0,
        tcp_wscale: 0,
        payload_len: 0,
        ip_len: ack.ip_len.saturating_sub(payload),
        ..*ack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpf_wire::pdesc::{Addr, AF_INET, IPPROTO_TCP};

    fn syn() -> PDesc {
        PDesc {
            src: Addr::v4([10, 0, 0, 1]),
            dst: Addr::v4([10, 1, 0, 1]),
            sport: 40000,
            dport: 80,
            af: AF_INET,
            proto: IPPROTO_TCP,
            tcp_flags: xpf_wire::tcp::SYN,
            tcp_seq: 1000,
            ..PDesc::default()
        }
    }

    fn ack_of(syn: &PDesc, cookie: u32) -> PDesc {
        PDesc { tcp_flags: xpf_wire::tcp::ACK, tcp_seq: syn.tcp_seq + 1, tcp_ack: cookie.wrapping_add(1), ..*syn }
    }

    #[test]
    fn a_cookie_proves_itself_for_two_epochs_and_nothing_else() {
        let mut c = Cookies::new([7; 32]);
        let s = syn();
        let (cookie, mss) = c.make(&s, Some(1460), 100);
        assert_eq!(mss, 1460);
        assert_eq!(c.check(&ack_of(&s, cookie), 100), Some(1460));
        assert_eq!(c.check(&ack_of(&s, cookie), 100 + EPOCH), Some(1460), "the next epoch");
        assert_eq!(c.check(&ack_of(&s, cookie), 100 + 2 * EPOCH), None, "two epochs on");
        // Another port, another client number, another secret: no.
        assert_eq!(c.check(&PDesc { sport: 40001, ..ack_of(&s, cookie) }, 100), None);
        assert_eq!(c.check(&PDesc { tcp_seq: 5, ..ack_of(&s, cookie) }, 100), None);
        assert_eq!(Cookies::new([8; 32]).check(&ack_of(&s, cookie), 100), None);
        // A forged ACK guessing the MAC: one in 2^28. 100,000 random tries find none.
        let mut hits = 0;
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            hits += c.check(&PDesc { tcp_ack: x, ..ack_of(&s, cookie) }, 100).is_some() as u32;
        }
        assert_eq!(hits, 0);
    }

    #[test]
    fn the_mss_is_the_largest_the_client_can_take() {
        let mut c = Cookies::new([1; 32]);
        for (offered, got) in
            [(Some(1460), 1460), (Some(1400), 1400), (Some(1300), 1200), (None, 536), (Some(100), 216)]
        {
            let (cookie, mss) = c.make(&syn(), offered, 3);
            assert_eq!(mss, got);
            assert_eq!(c.check(&ack_of(&syn(), cookie), 3), Some(got));
        }
    }

    #[test]
    fn adaptive_turns_on_at_start_and_off_below_end() {
        let mut c = Cookies::new([0; 32]);
        c.set_mode(Mode::Adaptive { start: 25, end: 12 });
        c.watch(249, 1000);
        assert!(!c.active());
        c.watch(250, 1000);
        assert!(c.active());
        c.watch(120, 1000);
        assert!(c.active(), "on until below end");
        c.watch(119, 1000);
        assert!(!c.active());
        assert_eq!(c.counters.floods, 1);
        c.set_mode(Mode::Always);
        assert!(c.active());
        c.set_mode(Mode::Never);
        assert!(!c.active());
    }
}
