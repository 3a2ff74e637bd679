//! pf's timeouts: names, defaults, and adaptive scaling (`pf_state_expires`).

macro_rules! timeouts {
    ($($var:ident = $name:literal, $def:expr;)*) => {
        /// A timeout class (pf's `PFTM_*`). A state records the class it is in; its deadline is
        /// its last activity plus the class's value, scaled when the table fills up.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Timeout { $($var,)* }

        impl Timeout {
            pub const ALL: &'static [Timeout] = &[$(Timeout::$var,)*];
            /// pf's name, as in `set timeout NAME VALUE` and `pfctl -st`.
            pub fn name(self) -> &'static str {
                match self { $(Timeout::$var => $name,)* }
            }
            pub fn from_name(s: &str) -> Option<Timeout> {
                match s { $($name => Some(Timeout::$var),)* _ => None }
            }
            /// pf's default, in seconds.
            pub fn default_secs(self) -> u32 {
                match self { $(Timeout::$var => $def,)* }
            }
            #[inline(always)]
            pub fn from_u8(x: u8) -> Timeout {
                Self::ALL[(x as usize).min(Self::ALL.len() - 1)]
            }
        }
    };
}

timeouts! {
    TcpFirst = "tcp.first", 120;
    TcpOpening = "tcp.opening", 30;
    TcpEstablished = "tcp.established", 86400;
    TcpClosing = "tcp.closing", 900;
    TcpFinWait = "tcp.finwait", 45;
    TcpClosed = "tcp.closed", 90;
    TcpTsDiff = "tcp.tsdiff", 30;
    UdpFirst = "udp.first", 60;
    UdpSingle = "udp.single", 30;
    UdpMultiple = "udp.multiple", 60;
    IcmpFirst = "icmp.first", 20;
    IcmpError = "icmp.error", 10;
    OtherFirst = "other.first", 60;
    OtherSingle = "other.single", 30;
    OtherMultiple = "other.multiple", 60;
    Frag = "frag", 60;
    Interval = "interval", 10;
    AdaptiveStart = "adaptive.start", 0;
    AdaptiveEnd = "adaptive.end", 0;
    SrcTrack = "src.track", 0;
}

/// The timeout values in force. `adaptive.start`/`adaptive.end` of 0 mean "derived from the
/// state limit": 60% and 120% of it, as pf does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    secs: [u32; Timeout::ALL.len()],
}

impl Default for Timeouts {
    fn default() -> Self {
        let mut secs = [0; Timeout::ALL.len()];
        for t in Timeout::ALL {
            secs[*t as usize] = t.default_secs();
        }
        Timeouts { secs }
    }
}

impl Timeouts {
    #[inline(always)]
    pub fn get(&self, t: Timeout) -> u32 {
        self.secs[t as usize]
    }
    pub fn set(&mut self, t: Timeout, secs: u32) {
        self.secs[t as usize] = secs;
    }
    /// (start, end) of adaptive scaling for a table of `limit` states.
    pub fn adaptive(&self, limit: u32) -> (u32, u32) {
        let s = self.get(Timeout::AdaptiveStart);
        let e = self.get(Timeout::AdaptiveEnd);
        if s == 0 && e == 0 {
            ((limit as u64 * 6 / 10) as u32, (limit as u64 * 12 / 10) as u32)
        } else {
            (s, e)
        }
    }
    /// Seconds a state of class `t` lives after its last packet, with `states` in a table of
    /// `limit`: scaled down linearly from adaptive.start to 0 at adaptive.end (pf_state_expires).
    #[inline]
    pub fn effective(&self, t: Timeout, states: u32, limit: u32) -> u32 {
        let v = self.get(t);
        let (start, end) = self.adaptive(limit);
        if end == 0 || states <= start || start >= end {
            return v;
        }
        if states >= end {
            return 0;
        }
        (v as u64 * (end - states) as u64 / (end - start) as u64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pf_defaults_and_names() {
        let t = Timeouts::default();
        assert_eq!(t.get(Timeout::TcpFirst), 120);
        assert_eq!(t.get(Timeout::TcpEstablished), 86400);
        assert_eq!(t.get(Timeout::UdpMultiple), 60);
        assert_eq!(t.get(Timeout::IcmpError), 10);
        assert_eq!(t.get(Timeout::Interval), 10);
        assert_eq!(Timeout::from_name("udp.single"), Some(Timeout::UdpSingle));
        assert_eq!(Timeout::from_name("udp.bogus"), None);
        for x in Timeout::ALL {
            assert_eq!(Timeout::from_name(x.name()), Some(*x));
            assert_eq!(Timeout::from_u8(*x as u8), *x);
        }
    }

    #[test]
    fn adaptive_scaling_is_linear() {
        let t = Timeouts::default();
        // limit 10000: start 6000, end 12000.
        assert_eq!(t.adaptive(10000), (6000, 12000));
        assert_eq!(t.effective(Timeout::UdpFirst, 6000, 10000), 60);
        assert_eq!(t.effective(Timeout::UdpFirst, 9000, 10000), 30);
        assert_eq!(t.effective(Timeout::UdpFirst, 12000, 10000), 0);
        let mut t2 = t.clone();
        t2.set(Timeout::AdaptiveStart, 100);
        t2.set(Timeout::AdaptiveEnd, 200);
        assert_eq!(t2.effective(Timeout::UdpFirst, 150, 10000), 30);
    }
}
