//! Capture files: classic pcap (draft-ietf-opsawg-pcap) and pcapng (SHB, IDB, EPB, SPB,
//! obsolete PB). Every length is checked; a damaged file gives an error naming the offset.

use std::fmt;

/// Link types xpf can feed to its parser.
pub const LINKTYPE_NULL: u32 = 0;
pub const LINKTYPE_ETHERNET: u32 = 1;
pub const LINKTYPE_PPP: u32 = 9;
pub const LINKTYPE_RAW: u32 = 101;
pub const LINKTYPE_LOOP: u32 = 108;
pub const LINKTYPE_LINUX_SLL: u32 = 113;
pub const LINKTYPE_IPV4: u32 = 228;
pub const LINKTYPE_IPV6: u32 = 229;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub linktype: u32,
    /// Nanoseconds since the epoch.
    pub ts_ns: u128,
    pub data: &'a [u8],
    /// Original length on the wire (may exceed `data.len()` when the snap length cut it).
    pub orig_len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub offset: usize,
    pub what: &'static str,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.what, self.offset)
    }
}
impl std::error::Error for Error {}

/// Reads every record of a pcap or pcapng file held in memory.
pub fn read(buf: &[u8]) -> Result<Vec<Record<'_>>, Error> {
    let magic = buf.get(0..4).ok_or(Error { offset: 0, what: "file shorter than a header" })?;
    match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => read_ng(buf),
        _ => read_classic(buf),
    }
}

fn u32_at(b: &[u8], at: usize, be: bool) -> Result<u32, Error> {
    let s: [u8; 4] = b.get(at..at + 4).ok_or(Error { offset: at, what: "truncated field" })?.try_into().unwrap();
    Ok(if be { u32::from_be_bytes(s) } else { u32::from_le_bytes(s) })
}

fn u16_at(b: &[u8], at: usize, be: bool) -> Result<u16, Error> {
    let s: [u8; 2] = b.get(at..at + 2).ok_or(Error { offset: at, what: "truncated field" })?.try_into().unwrap();
    Ok(if be { u16::from_be_bytes(s) } else { u16::from_le_bytes(s) })
}

fn read_classic(buf: &[u8]) -> Result<Vec<Record<'_>>, Error> {
    let m = u32_at(buf, 0, false)?;
    let (be, nanos) = match m {
        0xa1b2c3d4 => (false, false),
        0xa1b23c4d => (false, true),
        0xd4c3b2a1 => (true, false),
        0x4d3cb2a1 => (true, true),
        _ => return Err(Error { offset: 0, what: "not a pcap or pcapng file (bad magic)" }),
    };
    if buf.len() < 24 {
        return Err(Error { offset: buf.len(), what: "truncated pcap header" });
    }
    let linktype = u32_at(buf, 20, be)? & 0x0fff_ffff;
    let mut off = 24;
    let mut out = Vec::new();
    while off < buf.len() {
        if off + 16 > buf.len() {
            return Err(Error { offset: off, what: "truncated record header" });
        }
        let sec = u32_at(buf, off, be)? as u128;
        let frac = u32_at(buf, off + 4, be)? as u128;
        let incl = u32_at(buf, off + 8, be)? as usize;
        let orig = u32_at(buf, off + 12, be)?;
        let data =
            buf.get(off + 16..off + 16 + incl).ok_or(Error { offset: off, what: "record longer than the file" })?;
        let ts_ns = sec * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
        out.push(Record { linktype, ts_ns, data, orig_len: orig });
        off += 16 + incl;
    }
    Ok(out)
}

fn read_ng(buf: &[u8]) -> Result<Vec<Record<'_>>, Error> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut be = false;
    // (linktype, ts resolution in ns per unit)
    let mut ifaces: Vec<(u32, u128)> = Vec::new();
    while off < buf.len() {
        let btype_le = u32_at(buf, off, false)?;
        if btype_le == 0x0a0d0d0a {
            let bom = u32_at(buf, off + 8, false)?;
            be = match bom {
                0x1a2b3c4d => false,
                0x4d3c2b1a => true,
                _ => return Err(Error { offset: off + 8, what: "bad pcapng byte-order magic" }),
            };
            ifaces.clear();
        }
        let btype = u32_at(buf, off, be)?;
        let blen = u32_at(buf, off + 4, be)? as usize;
        if blen < 12 || !blen.is_multiple_of(4) || off + blen > buf.len() {
            return Err(Error { offset: off, what: "bad pcapng block length" });
        }
        let body = &buf[off + 8..off + blen - 4];
        match btype {
            1 => {
                // Interface description: linktype, reserved, snaplen, options (if_tsresol = 9).
                let lt = u16_at(body, 0, be)? as u32;
                let mut res: u128 = 1000; // microseconds by default
                let mut o = 8;
                while o + 4 <= body.len() {
                    let code = u16_at(body, o, be)?;
                    let len = u16_at(body, o + 2, be)? as usize;
                    if code == 0 {
                        break;
                    }
                    if code == 9 && len >= 1 {
                        let v = *body.get(o + 4).ok_or(Error { offset: off + 8 + o, what: "truncated option" })?;
                        let n = (v & 0x7f) as u32;
                        res = if v & 0x80 == 0 {
                            10u128.checked_pow(9u32.saturating_sub(n)).unwrap_or(1).max(1)
                        } else {
                            1 // powers of two below a nanosecond: round to ns
                        };
                    }
                    o += 4 + len.div_ceil(4) * 4;
                }
                ifaces.push((lt, res));
            }
            6 | 2 => {
                // Enhanced (6) or obsolete packet (2) block.
                let (ifid, ts_at, cap_at, orig_at, data_at) = if btype == 6 {
                    (u32_at(body, 0, be)?, 4, 12, 16, 20)
                } else {
                    (u16_at(body, 0, be)? as u32, 4, 12, 16, 20)
                };
                let (lt, res) = *ifaces
                    .get(ifid as usize)
                    .ok_or(Error { offset: off, what: "packet for an undeclared interface" })?;
                let ts = ((u32_at(body, ts_at, be)? as u128) << 32) | u32_at(body, ts_at + 4, be)? as u128;
                let cap = u32_at(body, cap_at, be)? as usize;
                let orig = u32_at(body, orig_at, be)?;
                let data = body
                    .get(data_at..data_at + cap)
                    .ok_or(Error { offset: off, what: "captured length beyond the block" })?;
                out.push(Record { linktype: lt, ts_ns: ts.saturating_mul(res), data, orig_len: orig });
            }
            3 => {
                // Simple packet block: interface 0, no timestamp.
                let (lt, _) = *ifaces.first().ok_or(Error { offset: off, what: "packet before any interface" })?;
                let orig = u32_at(body, 0, be)?;
                let cap = (orig as usize).min(body.len() - 4);
                out.push(Record { linktype: lt, ts_ns: 0, data: &body[4..4 + cap], orig_len: orig });
            }
            _ => {}
        }
        off += blen;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classic(nanos: bool, be: bool) -> Vec<u8> {
        let w32 = |v: u32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
        let w16 = |v: u16| if be { v.to_be_bytes() } else { v.to_le_bytes() };
        let mut f = Vec::new();
        f.extend_from_slice(&w32(if nanos { 0xa1b23c4d } else { 0xa1b2c3d4 }));
        f.extend_from_slice(&w16(2));
        f.extend_from_slice(&w16(4));
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&w32(65535));
        f.extend_from_slice(&w32(1));
        f.extend_from_slice(&w32(10));
        f.extend_from_slice(&w32(5));
        f.extend_from_slice(&w32(3));
        f.extend_from_slice(&w32(60));
        f.extend_from_slice(&[1, 2, 3]);
        f
    }

    #[test]
    fn classic_all_variants() {
        for (nanos, be) in [(false, false), (true, false), (false, true), (true, true)] {
            let f = classic(nanos, be);
            let r = read(&f).unwrap();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].data, &[1, 2, 3]);
            assert_eq!(r[0].orig_len, 60);
            assert_eq!(r[0].linktype, 1);
            assert_eq!(r[0].ts_ns, 10_000_000_000 + if nanos { 5 } else { 5000 });
        }
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let f = classic(false, false);
        for cut in 0..f.len() {
            let _ = read(&f[..cut]);
        }
        assert!(read(&f[..f.len() - 1]).is_err());
        assert!(read(b"junkjunkjunkjunkjunkjunk").is_err());
    }

    #[test]
    fn pcapng_minimal() {
        let mut f = Vec::new();
        // SHB: type, len 28, BOM, version 1.0, section length -1
        f.extend_from_slice(&0x0a0d0d0au32.to_le_bytes());
        f.extend_from_slice(&28u32.to_le_bytes());
        f.extend_from_slice(&0x1a2b3c4du32.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&0u16.to_le_bytes());
        f.extend_from_slice(&u64::MAX.to_le_bytes());
        f.extend_from_slice(&28u32.to_le_bytes());
        // IDB: linktype 1, snaplen, option if_tsresol=9 (ns)
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&28u32.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&0u16.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0]);
        f.extend_from_slice(&28u32.to_le_bytes());
        // EPB with 4 bytes of data
        f.extend_from_slice(&6u32.to_le_bytes());
        f.extend_from_slice(&36u32.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&1234u32.to_le_bytes());
        f.extend_from_slice(&4u32.to_le_bytes());
        f.extend_from_slice(&4u32.to_le_bytes());
        f.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        f.extend_from_slice(&36u32.to_le_bytes());
        let r = read(&f).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].data, &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(r[0].ts_ns, 1234);
        for cut in 0..f.len() {
            let _ = read(&f[..cut]);
        }
    }
}
