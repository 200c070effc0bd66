//! Who a request is: the hash of the API key it came with, and its prefix-cache tenant (the key
//! and the request's `cache_salt` together). Requests share cached prompt prefixes only within
//! one tenant.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Whether `given` is one of `keys`, in time that depends neither on where they differ nor on
/// which key it is (each is hashed first, and every key is compared); the matching key's hash.
pub(super) fn key_matches(given: &str, keys: &[String]) -> Option<[u8; 32]> {
    let a = Sha256::digest(given.as_bytes());
    let mut found = subtle::Choice::from(0);
    for key in keys {
        found |= a.ct_eq(&Sha256::digest(key.as_bytes()));
    }
    bool::from(found).then(|| a.into())
}

tokio::task_local! {
    /// The hash of the API key a request came with (set around its handler by the router's key check).
    pub(super) static KEY: [u8; 32];
}

/// The prefix-cache tenant of a request handled now: its API key's hash and its `cache_salt`
/// together (0 where neither is given: one shared tenant).
pub(super) fn tenant(salt: Option<&str>) -> u64 {
    let key = KEY.try_with(|k| *k).ok();
    if key.is_none() && salt.is_none() {
        return 0;
    }
    let mut h = Sha256::new();
    h.update(b"kiln tenant\0");
    if let Some(k) = key {
        h.update(b"key\0");
        h.update(k);
    }
    if let Some(s) = salt {
        h.update(b"salt\0");
        h.update(s.as_bytes());
    }
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes")).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        let keys = ["abc".to_string(), "xyz".to_string()];
        assert!(key_matches("abc", &keys).is_some());
        assert!(key_matches("xyz", &keys).is_some());
        assert_ne!(key_matches("abc", &keys), key_matches("xyz", &keys));
        for other in ["abd", "ab", "abcd", "", "ABC", "abc,xyz"] {
            assert!(key_matches(other, &keys).is_none(), "{other}");
        }
        assert!(key_matches("abc", &[]).is_none());
    }

    #[test]
    fn tenants_are_keys_and_salts() {
        assert_eq!(tenant(None), 0);
        let salted = tenant(Some("u1"));
        assert_ne!(salted, 0);
        assert_ne!(salted, tenant(Some("u2")));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let ka = rt.block_on(KEY.scope(a, async { tenant(None) }));
        let kb = rt.block_on(KEY.scope(b, async { tenant(None) }));
        let ka_salted = rt.block_on(KEY.scope(a, async { tenant(Some("u1")) }));
        assert!(ka != 0 && ka != kb && ka_salted != ka && ka_salted != salted);
    }
}
