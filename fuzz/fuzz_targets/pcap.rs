//! Arbitrary bytes as a capture file: the reader must return records or an error, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(recs) = xpf_io::pcap::read(data) {
        let mut f = Vec::new();
        for r in &recs {
            let _ = xpf_io::replay::to_ether(r, &mut f);
        }
    }
});
