//! Frames: building them (records grouped in sections by action, an end-of-frame section, the
//! header's length, the optional authentication trailer) and reading them back.
//!
//! A received frame is checked whole before any of it is used: header, version, length, and
//! every section's action and size. A frame that fails is dropped with its reason and nothing
//! in it is applied (pf applies the sections before the bad one; a half-applied frame is not
//! worth the saving).

use crate::auth::{AuthError, Signer, Verifier, TRAILER_LEN};
use crate::wire::{act, Header, Msg, Subheader, HANDLERS, HEADER_LEN, SUBHEADER_LEN, VERSION};

/// Builds frames of at most `max` bytes (the sync interface's MTU less the IP header).
#[derive(Debug, Clone)]
pub struct FrameBuilder {
    buf: Vec<u8>,
    max: usize,
    cksum: [u8; 16],
    /// (action, offset of its subheader, count) of the open section.
    open: Option<(u8, usize, u16)>,
    records: usize,
    signer: Option<Signer>,
}

impl FrameBuilder {
    pub fn new(max: usize, cksum: [u8; 16], signer: Option<Signer>) -> FrameBuilder {
        let mut b = FrameBuilder { buf: Vec::with_capacity(max), max, cksum, open: None, records: 0, signer };
        b.reset();
        b
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.buf.resize(HEADER_LEN, 0);
        self.open = None;
        self.records = 0;
    }

    fn tail(&self) -> usize {
        SUBHEADER_LEN + if self.signer.is_some() { TRAILER_LEN } else { 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    pub fn records(&self) -> usize {
        self.records
    }

    /// Records of `action` that fit in an empty frame.
    pub fn capacity(&self, action: u8) -> usize {
        (self.max - HEADER_LEN - SUBHEADER_LEN - self.tail()) / HANDLERS[action as usize].len.max(1)
    }

    /// Adds `m`; false when the frame has no room for it (finish it and add again).
    pub fn push(&mut self, m: &Msg) -> bool {
        let a = m.action();
        let len = HANDLERS[a as usize].len;
        let same = matches!(self.open, Some((oa, _, c)) if oa == a && c < u16::MAX);
        let need = len + if same { 0 } else { SUBHEADER_LEN };
        if self.buf.len() + need + self.tail() > self.max {
            return false;
        }
        if !same {
            let at = self.buf.len();
            self.buf.resize(at + SUBHEADER_LEN, 0);
            self.open = Some((a, at, 0));
        }
        let at = self.buf.len();
        self.buf.resize(at + len, 0);
        m.emit(&mut self.buf[at..]);
        if let Some((a, sh, c)) = &mut self.open {
            *c += 1;
            Subheader { action: *a, count: *c }.emit(&mut self.buf[*sh..]);
        }
        self.records += 1;
        true
    }

    /// Closes the frame (end-of-frame section, length, trailer) and returns it; None if empty.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        if self.records == 0 {
            return None;
        }
        let at = self.buf.len();
        self.buf.resize(at + SUBHEADER_LEN, 0);
        // OpenBSD counts the end-of-frame section as one; its records are empty.
        Subheader { action: act::EOF, count: 1 }.emit(&mut self.buf[at..]);
        let len = self.buf.len();
        Header { version: VERSION, len: len as u16, cksum: self.cksum }.emit(&mut self.buf);
        let mut f = std::mem::replace(&mut self.buf, Vec::with_capacity(self.max));
        if let Some(s) = &mut self.signer {
            s.sign(&mut f);
        }
        self.reset();
        Some(f)
    }
}

/// Why a received frame was dropped (pf's pfsyncstats names in the comments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Shorter than the header (hdrops).
    Short,
    /// Not version 5 (badver).
    Version(u8),
    /// The header's length exceeds the frame, or a section runs past it (badlen).
    Len,
    /// An action number past the last one, or one whose records have no length (badact).
    Action(u8),
    /// The IP TTL was not 255: sent from beyond the sync link (badttl).
    Ttl,
    /// Authentication (badauth).
    Auth(AuthError),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Short => write!(f, "shorter than the pfsync header"),
            Bad::Ttl => write!(f, "IP TTL is not 255"),
            Bad::Version(v) => write!(f, "version {v} (5 expected)"),
            Bad::Len => write!(f, "length does not match the sections"),
            Bad::Action(a) => write!(f, "action {a} not handled"),
            Bad::Auth(AuthError::Missing) => write!(f, "no authentication trailer"),
            Bad::Auth(AuthError::Mac) => write!(f, "authentication failed (forged or altered)"),
            Bad::Auth(AuthError::Replay) => write!(f, "replayed or too old"),
        }
    }
}

/// What a valid frame held besides its records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameInfo {
    pub header: Option<Header>,
    /// Records of actions xpf does not apply (the 1301 layout, DEL, ...), skipped by length.
    pub skipped: u32,
    pub records: u32,
}

/// Checks `frame` (from the pfsync header on) and hands its records to `f` in order. With a
/// verifier, the frame must carry a valid trailer and is recorded as seen.
pub fn parse(frame: &[u8], auth: Option<&mut Verifier>, mut f: impl FnMut(Msg)) -> Result<FrameInfo, Bad> {
    let h = Header::parse(frame).ok_or(Bad::Short)?;
    if h.version != VERSION {
        return Err(Bad::Version(h.version));
    }
    let len = h.len as usize;
    if len < HEADER_LEN || len > frame.len() {
        return Err(Bad::Len);
    }
    // Structure first: nothing is applied from a frame that is bad anywhere.
    let mut info = FrameInfo { header: Some(h), ..Default::default() };
    walk(&frame[..len], |_, _, _| {})?;
    if let Some(v) = auth {
        v.verify(frame, len).map_err(Bad::Auth)?;
    }
    walk(&frame[..len], |action, count, body| {
        let hd = HANDLERS[action as usize];
        match hd.decode {
            Some(d) => {
                for r in body.chunks_exact(hd.len).take(count) {
                    f(d(r));
                    info.records += 1;
                }
            }
            None => info.skipped += count as u32,
        }
    })?;
    Ok(info)
}

/// Walks the sections of `frame[..header.len]`, calling `f(action, count, records)`.
fn walk(frame: &[u8], mut f: impl FnMut(u8, usize, &[u8])) -> Result<(), Bad> {
    let mut at = HEADER_LEN;
    while at < frame.len() {
        let sh = Subheader::parse(&frame[at..]).ok_or(Bad::Len)?;
        at += SUBHEADER_LEN;
        if sh.action >= act::MAX {
            return Err(Bad::Action(sh.action));
        }
        if sh.action == act::EOF {
            return Ok(());
        }
        let hd = HANDLERS[sh.action as usize];
        if hd.len == 0 {
            return Err(Bad::Action(sh.action));
        }
        let n = sh.count as usize * hd.len;
        let body = frame.get(at..at + n).ok_or(Bad::Len)?;
        f(sh.action, sh.count as usize, body);
        at += n;
    }
    // FreeBSD ends a frame without an EOF section: the header's length ends it.
    Ok(())
}
