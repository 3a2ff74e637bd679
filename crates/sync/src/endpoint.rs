//! The protocol core of one firewall, without I/O and without a clock: the caller passes
//! `now` (milliseconds on any monotonic clock) and the frames that arrived, and takes the
//! frames to send and the records to apply to the state tables (quinn-proto's pattern).
//!
//! It owns what is not per state: receive checks and counters, authentication, and the two
//! bulk-update state machines. Receiving (a standby that starts, or `xpfctl sync bulk`):
//! `Idle -> Requested` (an update request for id 0, creator 0) `-> Receiving` (the peer's
//! bulk-status START) `-> Done` (its END); a request unanswered, or a bulk that stalls, is
//! asked again every `retry_ms`, up to `tries` times, then `Failed`. Sending: a request makes
//! `Sending` (START sent; the caller's workers export every state), ended by
//! [`Endpoint::bulk_done`] (END sent).

use crate::auth::{Key, Signer, Verifier};
use crate::frame::{self, Bad, FrameBuilder};
use crate::wire::{act, Bus, Msg, StateId, BUS_END, BUS_START, TTL};

#[derive(Debug, Clone)]
pub struct Config {
    /// This firewall's creator id (pf's hostid): part of every state id it makes.
    pub creatorid: u32,
    /// Ruleset checksum for the frame header.
    pub cksum: [u8; 16],
    /// Largest frame, from the pfsync header on (the sync link's MTU less the IP header).
    pub max_frame: usize,
    pub key: Option<Key>,
    /// Seconds that grow across restarts (the start time): the authentication epoch.
    pub epoch: u32,
    pub retry_ms: u64,
    pub tries: u32,
    /// Defer mode: inserts ask the peer for an insert ack (PFSTATE_ACK); the first packet of
    /// a new state is held until it comes (xpfd's `--sync-defer`).
    pub defer: bool,
}

impl Config {
    pub fn new(creatorid: u32) -> Config {
        Config {
            creatorid,
            cksum: [0; 16],
            max_frame: 1480,
            key: None,
            epoch: 0,
            retry_ms: 5000,
            tries: 12,
            defer: false,
        }
    }
    /// A frame builder for stream `stream` (0 is the endpoint's own; workers take 1 on).
    pub fn builder(&self, stream: u16) -> FrameBuilder {
        let signer = self.key.clone().map(|k| Signer::new(k, self.creatorid, stream, self.epoch));
        FrameBuilder::new(self.max_frame, self.cksum, signer)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkIn {
    Idle,
    Requested { at: u64, tries: u32 },
    Receiving { creator: u32, started: u64, last: u64, states: u64, tries: u32 },
    Done { creator: u32, states: u64, ms: u64 },
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkOut {
    Idle,
    Sending { started: u64 },
    Done { states: u64, ms: u64 },
}

/// pfsync's counters (`netstat -s -p pfsync`), and xpf's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub ipackets: u64,
    pub badttl: u64,
    pub hdrops: u64,
    pub badver: u64,
    pub badact: u64,
    pub badlen: u64,
    pub badauth: u64,
    /// Authentic but replayed or too old (xpf).
    pub replayed: u64,
    /// Records of actions xpf does not apply, skipped.
    pub skipped: u64,
    pub iacts: [u64; act::MAX as usize],
    pub opackets: u64,
    pub obytes: u64,
    pub oacts: [u64; act::MAX as usize],
}

impl Stats {
    pub fn bad(&self) -> u64 {
        self.badttl + self.hdrops + self.badver + self.badact + self.badlen + self.badauth + self.replayed
    }
    pub fn count_out(&mut self, frame: &[u8]) {
        self.opackets += 1;
        self.obytes += frame.len() as u64;
        let _ = frame::parse(frame, None, |m| self.oacts[m.action() as usize] += 1);
    }
}

pub struct Endpoint {
    pub cfg: Config,
    verifier: Option<Verifier>,
    out: FrameBuilder,
    ready: Vec<Vec<u8>>,
    pub stats: Stats,
    pub bulk_in: BulkIn,
    pub bulk_out: BulkOut,
    /// Someone asked for a bulk update: the caller starts its workers' export and calls
    /// [`Endpoint::bulk_started`].
    pub bulk_wanted: bool,
}

impl Endpoint {
    pub fn new(cfg: Config) -> Endpoint {
        let verifier = cfg.key.clone().map(Verifier::new);
        let out = cfg.builder(0);
        Endpoint {
            cfg,
            verifier,
            out,
            ready: Vec::new(),
            stats: Stats::default(),
            bulk_in: BulkIn::Idle,
            bulk_out: BulkOut::Idle,
            bulk_wanted: false,
        }
    }

    fn send(&mut self, m: Msg) {
        if !self.out.push(&m) {
            self.ready.extend(self.out.finish());
            self.out.push(&m);
        }
    }

    /// Frames to transmit now (control messages go out at once).
    pub fn transmit(&mut self) -> Vec<Vec<u8>> {
        self.ready.extend(self.out.finish());
        let v = std::mem::take(&mut self.ready);
        for f in &v {
            self.stats.count_out(f);
        }
        v
    }

    /// Asks the peer for every state (a standby starting, or an operator's request).
    pub fn request_bulk(&mut self, now: u64) {
        self.send(Msg::UpdateReq(StateId { id: 0, creatorid: 0 }));
        let tries = match self.bulk_in {
            BulkIn::Requested { tries, .. } | BulkIn::Receiving { tries, .. } => tries + 1,
            _ => 1,
        };
        self.bulk_in = BulkIn::Requested { at: now, tries };
    }

    /// Timers: bulk requests unanswered, bulks that stopped.
    pub fn poll(&mut self, now: u64) {
        let (since, tries) = match self.bulk_in {
            BulkIn::Requested { at, tries } => (at, tries),
            BulkIn::Receiving { last, tries, .. } => (last, tries),
            _ => return,
        };
        if now.saturating_sub(since) < self.cfg.retry_ms {
            return;
        }
        if tries >= self.cfg.tries {
            self.bulk_in = BulkIn::Failed;
        } else {
            self.request_bulk(now);
        }
    }

    /// A frame arrived with IP TTL `ttl`. The records to apply go to `apply`; the frame's
    /// drop reason is returned (and counted) if it is bad.
    pub fn receive(&mut self, now: u64, frame: &[u8], ttl: u8, apply: &mut Vec<Msg>) -> Result<(), Bad> {
        self.stats.ipackets += 1;
        if ttl != TTL {
            self.stats.badttl += 1;
            return Err(Bad::Ttl);
        }
        let start = apply.len();
        let r = frame::parse(frame, self.verifier.as_mut(), |m| apply.push(m));
        let info = match r {
            Ok(i) => i,
            Err(e) => {
                match e {
                    Bad::Short => self.stats.hdrops += 1,
                    Bad::Version(_) => self.stats.badver += 1,
                    Bad::Len => self.stats.badlen += 1,
                    Bad::Action(_) => self.stats.badact += 1,
                    Bad::Auth(crate::auth::AuthError::Replay) => self.stats.replayed += 1,
                    Bad::Auth(_) => self.stats.badauth += 1,
                    Bad::Ttl => self.stats.badttl += 1,
                }
                return Err(e);
            }
        };
        self.stats.skipped += info.skipped as u64;
        // Rule numbers name rules only in an identical ruleset (pf's PFSYNC_SI_CKSUM).
        let same_rules = info.header.is_some_and(|h| h.cksum == self.cfg.cksum);
        // Bulk control stays here; state records go on to the tables.
        let mut i = start;
        while i < apply.len() {
            let m = apply[i];
            self.stats.iacts[m.action() as usize] += 1;
            let keep = match m {
                Msg::UpdateReq(StateId { id: 0, creatorid: 0 }) => {
                    self.bulk_wanted = true;
                    false
                }
                Msg::Bus(b) => {
                    self.on_bus(now, b);
                    false
                }
                Msg::Insert(_) | Msg::Update(_) => {
                    if !same_rules {
                        if let Msg::Insert(r) | Msg::Update(r) = &mut apply[i] {
                            r.rule = u32::MAX;
                        }
                    }
                    if let BulkIn::Receiving { last, states, .. } = &mut self.bulk_in {
                        *last = now;
                        *states += 1;
                    }
                    true
                }
                _ => true,
            };
            if keep {
                i += 1;
            } else {
                apply.remove(i);
            }
        }
        Ok(())
    }

    fn on_bus(&mut self, now: u64, b: Bus) {
        match (b.status, self.bulk_in) {
            (BUS_START, BulkIn::Requested { tries, .. }) => {
                self.bulk_in = BulkIn::Receiving { creator: b.creatorid, started: now, last: now, states: 0, tries }
            }
            (BUS_END, BulkIn::Receiving { creator, started, states, .. }) if creator == b.creatorid => {
                self.bulk_in = BulkIn::Done { creator, states, ms: now - started }
            }
            _ => {}
        }
    }

    /// The caller's workers start exporting every state.
    pub fn bulk_started(&mut self, now: u64) {
        self.bulk_wanted = false;
        self.bulk_out = BulkOut::Sending { started: now };
        self.send(Msg::Bus(Bus { creatorid: self.cfg.creatorid, endtime: 0, status: BUS_START }));
    }

    /// Every worker has sent its states (`states` in all).
    pub fn bulk_done(&mut self, now: u64, states: u64) {
        let started = match self.bulk_out {
            BulkOut::Sending { started } => started,
            _ => now,
        };
        let secs = ((now - started) / 1000) as u32;
        self.send(Msg::Bus(Bus { creatorid: self.cfg.creatorid, endtime: secs, status: BUS_END }));
        self.bulk_out = BulkOut::Done { states, ms: now - started };
    }
}
