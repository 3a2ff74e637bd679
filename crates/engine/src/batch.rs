//! What a batch leaves its caller besides the verdicts: one value, returned.
//!
//! [`crate::Worker::process_tagged`] clears its [`Batch`] when it starts and returns it when
//! it ends; the batch's outputs hold until the next call (read them meanwhile with
//! [`crate::Worker::batch`]). Per-frame outputs are a bit mask (bit i: frame i of the batch)
//! with an array indexed by frame; frames the batch adds are vectors of (frame index, bytes).
//! The caller applies the rewrites to each frame before it leaves and sends what the vectors
//! hold; it never clears anything.

use crate::nat::Rewrite;
use crate::policy::Scrub;
use crate::{LogMark, BATCH};

#[derive(Debug, Clone)]
pub struct Batch {
    /// `modulate state`: frames to rewrite before they leave, with (added to SEQ, taken from
    /// ACK and SACK); [`crate::proto::apply_modulation`] does it.
    pub patched: u64,
    pub patches: [(u32, u32); BATCH],
    /// Translation (`nat-to`, `rdr-to`, `binat-to`): frames to rewrite before they go on, with
    /// what they become ([`xpf_wire::translate::apply`]): the state's other key on a hit, the
    /// new flow's translation on a miss. An `in` pass's rewrite changes what the `out` pass
    /// sees and where the packet is routed.
    pub translated: u64,
    pub rewrites: [Rewrite; BATCH],
    /// `scrub (...)`: frames to rewrite before they leave, with what to do
    /// ([`crate::proto::apply_scrub`]): the rules' actions on a miss, the state's on a hit.
    pub scrubbed: u64,
    pub scrubs: [Scrub; BATCH],
    /// Frames that created a state, and which (slot, with [`crate::V6_SLOT`] for IPv6):
    /// sync's defer mode holds them.
    pub created: u64,
    pub created_ids: [u32; BATCH],
    /// `log`: frames a logging rule decided, with what pflog records of them.
    pub logged: u64,
    pub logs: [LogMark; BATCH],
    /// `set queue`: each frame's queue ids (`q | ack << 16`, 0: none), from its state or, on
    /// a miss, its rules ([`crate::Worker::queue_of`] picks one); two more slots: a reassembled
    /// datagram's miss writes past BATCH.
    pub queues: [u32; BATCH + 2],
    /// `route-to` / `reply-to`: each frame's routing target ([`crate::Policy::route`], 0:
    /// the routing table's), from its state or, on a miss, its rule; two more slots as for
    /// the queues. A state's packet leaving by another interface than its target's is not
    /// filtered there (the caller filters it leaving by the target's, as pf_route does).
    pub routes: [u16; BATCH + 2],
    /// Fragments of datagrams the batch completed and passed, in datagram order, each with
    /// the index of the frame that completed it (its route is theirs).
    pub released: Vec<(u8, Vec<u8>)>,
    /// Which of them (by that index) a translation rewrote: their route is the rewritten
    /// destination's, not the completing frame's.
    pub released_translated: u64,
    /// Fragments of datagrams to this host that were not a translation's: back to the host's
    /// stack as they came.
    pub host_pieces: Vec<(u8, Vec<u8>)>,
    /// `block return` and synproxy's answers, each with the index of the frame answered: sent
    /// out of the interface that frame came in on (buffers back with
    /// [`crate::Worker::recycle`]).
    pub returns: Vec<(u8, Vec<u8>)>,
    /// Frames that go on as another segment (`synproxy state`): these bytes are filtered and
    /// sent in the frame's place.
    pub substitutes: Vec<(u8, Vec<u8>)>,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Batch {
            patched: 0,
            patches: [(0, 0); BATCH],
            translated: 0,
            rewrites: [Rewrite::default(); BATCH],
            scrubbed: 0,
            scrubs: [Scrub::NONE; BATCH],
            created: 0,
            created_ids: [0; BATCH],
            logged: 0,
            logs: [LogMark::default(); BATCH],
            queues: [0; BATCH + 2],
            routes: [0; BATCH + 2],
            released: Vec::new(),
            released_translated: 0,
            host_pieces: Vec::new(),
            returns: Vec::new(),
            substitutes: Vec::new(),
        }
    }

    /// Empties it for a batch of `n` frames: the masks and vectors (arrays are read only where
    /// their mask says, but for the queues and routes, which every frame has).
    #[inline(always)]
    pub(crate) fn clear(&mut self, n: usize) {
        self.patched = 0;
        self.translated = 0;
        self.scrubbed = 0;
        self.created = 0;
        self.logged = 0;
        self.released_translated = 0;
        self.queues[..n].fill(0);
        self.routes[..n].fill(0);
        self.released.clear();
        self.host_pieces.clear();
        self.returns.clear();
        self.substitutes.clear();
    }
}
