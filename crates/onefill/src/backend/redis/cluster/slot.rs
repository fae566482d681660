//! The hash slot of a key, as Redis Cluster computes it.

/// Hash slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key
/// without one, modulo 16384, as Redis Cluster computes it.
pub(in super::super) fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// A short name whose slot is `slot` (decimal digits: the first number
/// that hashes there), for a channel that must live on the master of that
/// slot. About 16,384 numbers are tried on average: done once per master.
pub(in super::super) fn tag_in(slot: u16) -> String {
    let slot = slot % SLOTS as u16;
    (0u32..)
        .map(|n| n.to_string())
        .find(|tag| slot_of(tag.as_bytes()) == slot)
        // CRC16 reaches every residue of 16384 among the numbers below
        // 2^32, so the search ends; the fallback is never taken.
        .unwrap_or_default()
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_computed_as_redis_does() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

    #[test]
    fn a_tag_is_found_for_every_slot() {
        for slot in [0, 1, 5460, 5461, 10922, 16383] {
            let tag = tag_in(slot);
            assert_eq!(slot_of(tag.as_bytes()), slot, "{tag}");
            assert_eq!(slot_of(format!("x:{{{tag}}}:y").as_bytes()), slot);
        }
    }
}
