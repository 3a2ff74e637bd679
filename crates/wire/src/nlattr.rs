//! rtnetlink's attributes (struct rtattr: length u16, type u16, payload, padded to 4 bytes),
//! as the kernel's answers carry them: the one piece of netlink both xpfd's requests
//! (crates/xdp/src/netlink.rs) and the route reader (crates/conf/src/routes.rs) parse.

/// Iterates the attributes of `b`: (type without its flag bits, payload). Stops at the first
/// malformed one.
pub fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let v = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((ty, v))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn attributes_are_read_with_their_padding_and_a_bad_length_stops() {
        let b = [6, 0, 1, 0, 0xaa, 0xbb, 0, 0, 8, 0, 4, 0, 1, 0, 0, 0, 3, 0];
        let v: Vec<_> = super::attrs(&b).collect();
        assert_eq!(v, vec![(1, &[0xaa, 0xbb][..]), (4, &[1, 0, 0, 0][..])]);
    }
}
