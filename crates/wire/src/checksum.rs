//! Internet checksum (RFC 1071): full computation, and incremental update (RFC 1624) for the
//! NAT and TTL rewrites, so a changed field never needs the whole packet summed again.

/// Ones'-complement sum of `data` added to `initial`, not folded and not complemented.
#[inline]
pub fn sum(data: &[u8], initial: u32) -> u32 {
    let mut acc = initial as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // Adding the two 32-bit halves keeps the sum exact in 64 bits for any length below 4 GiB.
        acc += (w >> 32) + (w & 0xffff_ffff);
    }
    let rest = chunks.remainder();
    let mut i = 0;
    while i + 1 < rest.len() {
        acc += u16::from_be_bytes([rest[i], rest[i + 1]]) as u64;
        i += 2;
    }
    if i < rest.len() {
        acc += (rest[i] as u64) << 8;
    }
    fold64(acc)
}

#[inline]
fn fold64(mut acc: u64) -> u32 {
    while acc > 0xffff_ffff {
        acc = (acc & 0xffff_ffff) + (acc >> 32);
    }
    acc as u32
}

/// Folds a 32-bit partial sum to 16 bits.
#[inline]
pub fn fold(mut acc: u32) -> u16 {
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc as u16
}

/// The checksum field value for `data` (the complement of the folded sum).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

/// Pseudo-header sum for TCP/UDP over IPv4 (RFC 793 section 3.1).
#[inline]
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], proto: u8, len: u16) -> u32 {
    let mut acc = 0u32;
    acc += u16::from_be_bytes([src[0], src[1]]) as u32 + u16::from_be_bytes([src[2], src[3]]) as u32;
    acc += u16::from_be_bytes([dst[0], dst[1]]) as u32 + u16::from_be_bytes([dst[2], dst[3]]) as u32;
    acc + proto as u32 + len as u32
}

/// Pseudo-header sum for upper layers over IPv6 (RFC 8200 section 8.1).
#[inline]
pub fn pseudo_v6(src: &[u8; 16], dst: &[u8; 16], next: u8, len: u32) -> u32 {
    let s = sum(src, 0);
    let d = sum(dst, s);
    fold64(d as u64 + (len >> 16) as u64 + (len & 0xffff) as u64 + next as u64)
}

/// RFC 1624 eqn. 3: the new checksum after a 16-bit field changes from `old` to `new`.
#[inline]
pub fn update16(cksum: u16, old: u16, new: u16) -> u16 {
    let acc = (!cksum as u32) + (!old as u32) + new as u32;
    !fold(acc)
}

/// RFC 1624 for a 32-bit field (an IPv4 address), as two 16-bit words.
#[inline]
pub fn update32(cksum: u16, old: u32, new: u32) -> u16 {
    let acc = (!cksum as u32) + (!(old >> 16) as u16) as u32 + (!(old as u16)) as u32 + (new >> 16) + (new & 0xffff);
    !fold(acc)
}

/// RFC 1624 for a 128-bit field (an IPv6 address).
#[inline]
pub fn update128(cksum: u16, old: &[u8; 16], new: &[u8; 16]) -> u16 {
    let mut acc = !cksum as u32;
    for i in (0..16).step_by(2) {
        acc += !u16::from_be_bytes([old[i], old[i + 1]]) as u32;
        acc += u16::from_be_bytes([new[i], new[i + 1]]) as u32;
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // RFC 1071 section 3 example bytes.
    #[test]
    fn rfc1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data, 0)), 0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(sum(&[0x12, 0x34, 0x56], 0)), 0x1234 + 0x5600);
    }

    #[test]
    fn ipv4_header_fixture() {
        // 45 00 00 73 00 00 40 00 40 11 [b8 61] c0 a8 00 01 c0 a8 00 c7 (Wikipedia's example)
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
        h[10] = 0xb8;
        h[11] = 0x61;
        assert_eq!(checksum(&h), 0);
    }

    proptest! {
        #[test]
        fn incremental16_matches_full(mut data in proptest::collection::vec(any::<u8>(), 2..64usize), at in 0usize..31, new in any::<u16>()) {
            if data.len() % 2 == 1 { data.push(0); }
            let at = (at * 2) % data.len();
            let before = checksum(&data);
            let old = u16::from_be_bytes([data[at], data[at + 1]]);
            data[at..at + 2].copy_from_slice(&new.to_be_bytes());
            let full = checksum(&data);
            let inc = update16(before, old, new);
            // 0x0000 and 0xffff are the same value in ones' complement.
            prop_assert!(inc == full || (inc ^ full) == 0xffff, "inc {:x} full {:x}", inc, full);
        }

        #[test]
        fn incremental32_and_128_match_full(mut data in proptest::collection::vec(any::<u8>(), 16..16 + 1), new4 in any::<u32>(), new16 in any::<[u8; 16]>()) {
            let before = checksum(&data);
            let old4 = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
            data[0..4].copy_from_slice(&new4.to_be_bytes());
            let c4 = update32(before, old4, new4);
            let f4 = checksum(&data);
            prop_assert!(c4 == f4 || (c4 ^ f4) == 0xffff);
            let old16: [u8; 16] = data[0..16].try_into().unwrap();
            data[0..16].copy_from_slice(&new16);
            let c16 = update128(f4, &old16, &new16);
            let f16 = checksum(&data);
            prop_assert!(c16 == f16 || (c16 ^ f16) == 0xffff);
        }
    }
}
