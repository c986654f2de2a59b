//! The DNS stub (proxy/src/dns.rs): a query in, a reply out. Never panics;
//! a reply echoes the id, has QR set and fits in a UDP datagram; a name it
//! records is normalized.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veris_proxy::inbound::dns::{answer, Names};

fuzz_target!(|data: &[u8]| {
    let names = Names::new(8);
    for _ in 0..2 {
        let Ok((reply, lookup)) = answer(data, &names) else {
            return;
        };
        assert!(
            reply.len() >= 12 && reply.len() <= 512,
            "{} bytes",
            reply.len()
        );
        assert_eq!(&reply[..2], &data[..2]);
        assert!(reply[2] & 0x80 != 0, "QR set");
        if let Some(l) = lookup {
            assert!(!l.name.is_empty() && l.name.len() <= 253);
            assert!(!l.name.ends_with('.'));
            assert_eq!(l.name, l.name.to_ascii_lowercase());
        }
    }
});
