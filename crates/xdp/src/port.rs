//! A filtered interface's queue as the dataplane sees it: an AF_XDP socket, or the AF_PACKET
//! fallback. Both hand out frames with the routing metadata in front of them and take frames
//! to send by copy, so the worker's loop is the same for either.

use crate::packet::PacketPort;
use crate::xsk::{Desc, Xsk, XskStats};

pub enum PortIo {
    Xdp(Xsk),
    Packet(PacketPort),
}

impl PortIo {
    #[inline]
    pub fn rx_burst(&mut self, out: &mut [Desc]) -> usize {
        match self {
            PortIo::Xdp(x) => x.rx_burst(out),
            PortIo::Packet(p) => p.rx_burst(out),
        }
    }

    /// # Safety
    /// The slice must not be used after the frame is given back with `rx_done`.
    #[inline]
    pub unsafe fn frame_unbound<'a>(&self, addr: u64, len: u32) -> &'a [u8] {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            match self {
                PortIo::Xdp(x) => x.frame_unbound(addr, len),
                PortIo::Packet(p) => p.frame_unbound(addr, len),
            }
        }
    }

    #[inline]
    pub fn rx_done(&mut self, descs: &[Desc]) {
        match self {
            PortIo::Xdp(x) => x.rx_done(descs),
            PortIo::Packet(p) => p.rx_done(descs),
        }
    }

    #[inline]
    pub fn tx_copy(&mut self, bytes: &[u8]) -> Option<&mut [u8]> {
        match self {
            PortIo::Xdp(x) => x.tx_copy(bytes),
            PortIo::Packet(p) => p.tx_copy(bytes),
        }
    }

    /// Whether answers the firewall makes itself may take a transmit slot (a quarter of the
    /// ring stays for forwarded traffic).
    #[inline]
    pub fn room_for_answers(&mut self) -> bool {
        match self {
            PortIo::Xdp(x) => x.room_for_answers(),
            PortIo::Packet(p) => p.room_for_answers(),
        }
    }

    /// Whether a frame received here may be a segment of a fast-path flow that the kernel
    /// handed over to be judged: metadata says so on an XDP port; a packet port's socket
    /// filter cannot mark what it hands over, so any frame may be one there.
    #[inline]
    pub fn handed_over(&self, meta: &[u8]) -> bool {
        match self {
            PortIo::Xdp(_) => crate::steer::fast_flow(meta),
            PortIo::Packet(_) => true,
        }
    }

    /// Whether [`PortIo::tx_checksum`] can be asked.
    #[inline]
    pub fn can_tx_checksum(&self) -> bool {
        match self {
            PortIo::Xdp(x) => x.can_tx_checksum(),
            PortIo::Packet(_) => true,
        }
    }

    /// Asks the transmit path to finish the TCP/UDP checksum of the frame queued last (see
    /// [`Xsk::tx_checksum`]); false when it cannot, and the caller finishes it.
    #[inline]
    pub fn tx_checksum(&mut self, start: u16, offset: u16) -> bool {
        match self {
            PortIo::Xdp(x) => x.tx_checksum(start, offset),
            PortIo::Packet(p) => p.tx_checksum(start, offset),
        }
    }

    /// Sends a GSO packet (packet mode receives them from senders that leave segmentation to
    /// offload) for the kernel to segment; false when this port cannot.
    pub fn tx_gso(&mut self, frame: &[u8], gso_type: u8, gso_size: u16, start: u16, offset: u16, hdr_len: u16) -> bool {
        match self {
            PortIo::Xdp(_) => false,
            PortIo::Packet(p) => p.tx_gso(frame, gso_type, gso_size, start, offset, hdr_len),
        }
    }

    /// The kernel resolved `nexthop` on `ifindex`: packet mode's cached routes take its link
    /// address (the steering program asks the kernel itself, per packet).
    pub fn neighbour_resolved(&mut self, ifindex: u32, nexthop: &[u8; 16], mac: [u8; 6]) {
        if let PortIo::Packet(p) = self {
            p.neighbour_resolved(ifindex, nexthop, mac);
        }
    }

    #[inline]
    pub fn flush(&mut self) {
        match self {
            PortIo::Xdp(x) => x.flush(),
            PortIo::Packet(p) => p.flush(),
        }
    }

    pub fn fd(&self) -> i32 {
        match self {
            PortIo::Xdp(x) => x.fd(),
            PortIo::Packet(p) => p.fd(),
        }
    }

    /// The socket for new connections, when the port has one: a sleeping worker waits on it
    /// too.
    pub fn syn_fd(&self) -> Option<i32> {
        match self {
            PortIo::Xdp(x) => x.syn_fd(),
            PortIo::Packet(p) => p.syn_fd(),
        }
    }

    pub fn kernel_stats(&mut self) -> XskStats {
        match self {
            PortIo::Xdp(x) => x.kernel_stats(),
            PortIo::Packet(p) => p.kernel_stats(),
        }
    }

    /// Packet mode's classification counters (XDP mode keeps them in the steering program).
    pub fn packet_counters(&self) -> Option<[u64; 8]> {
        match self {
            PortIo::Xdp(_) => None,
            PortIo::Packet(p) => Some(p.counters),
        }
    }
}
