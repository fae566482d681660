//! Key material is erased: no heap block this thread frees while a key
//! ring is made, grown, cloned, used and dropped still holds a key, raw or
//! in base64.
//!
//! A file of its own because it installs a global allocator (one per test
//! binary), which looks into every block freed on a watching thread before
//! handing it back to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use onefill::{Codec, Encrypted, JsonCodec, KeyRing, KEY_LEN};

/// Three keys nothing else in the process holds (no run of zeros or one
/// repeated byte, which freed memory holds all the time).
const fn key(mul: u8, add: u8) -> [u8; KEY_LEN] {
    let mut key = [0; KEY_LEN];
    let mut i = 0;
    while i < KEY_LEN {
        key[i] = (i as u8).wrapping_mul(mul).wrapping_add(add);
        i += 1;
    }
    key
}
const KEY_1: [u8; KEY_LEN] = key(37, 11);
const KEY_2: [u8; KEY_LEN] = key(53, 201);
const KEY_3: [u8; KEY_LEN] = key(71, 99);
/// The same keys in standard base64, as a key list gives them.
const BASE64: [&str; 3] = [
    "CzBVep/E6Q4zWH2ix+wRNluApcrvFDleg6jN8hc8YYY=",
    "yf4zaJ3SBzxxptsQRXqv5BlOg7jtIleMwfYrYJXK/zQ=",
    "Y6rxOH/GDVSb4ilwt/5FjNMaYajvNn3EC1KZ4Cdutfw=",
];

/// Half a key is enough to count: a partial copy leaks as much.
const SEEN: usize = KEY_LEN / 2;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// Freed blocks that still held key material, on this thread while
    /// it watched (per thread: tests run side by side).
    static LEFT: Cell<usize> = const { Cell::new(0) };
}

struct Watching;

// SAFETY: every call is passed to `System` (an allocation as a zeroed one,
// which satisfies the same contract); `dealloc` only reads
// the block it is given, which is valid until it is handed back.
unsafe impl GlobalAlloc for Watching {
    // Every block starts zeroed: a block's spare capacity would otherwise
    // hold whatever its last owner left there (another test's key list,
    // freed before it watched), and a freed block is looked into whole.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if WATCHING.try_with(Cell::get).unwrap_or(false) {
            let block = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            let raw = [&KEY_1, &KEY_2, &KEY_3]
                .iter()
                .any(|k| holds(block, &k[..SEEN]));
            let text = BASE64.iter().any(|k| holds(block, &k.as_bytes()[..SEEN]));
            if raw || text {
                let _ = LEFT.try_with(|left| left.set(left.get() + 1));
            }
        }
        unsafe { System.dealloc(ptr, layout) }
    }
    // No `realloc`: the trait's own allocates, copies and calls `dealloc`
    // on the old block, so a block a `Vec` outgrows is looked into too.
}

#[global_allocator]
static ALLOCATOR: Watching = Watching;

fn holds(block: &[u8], needle: &[u8]) -> bool {
    block.windows(needle.len()).any(|w| w == needle)
}

/// How many freed blocks held key material while `f` ran on this thread.
fn left_behind(f: impl FnOnce()) -> usize {
    LEFT.with(|left| left.set(0));
    WATCHING.with(|w| w.set(true));
    f();
    WATCHING.with(|w| w.set(false));
    LEFT.with(Cell::get)
}

/// Regression: the ring kept its ciphers (each holding its key) in a `Vec`;
/// adding a key past its capacity moved them to a larger block and freed
/// the old one with the keys still in it.
#[test]
fn a_growing_ring_leaves_no_key_in_freed_memory() {
    let left = left_behind(|| {
        let ring = KeyRing::new(1, &KEY_1)
            .with_key(2, &KEY_2)
            .and_then(|r| r.with_key(3, &KEY_3))
            .expect("a ring");
        let copy = ring.clone();
        drop(ring);
        drop(copy);
    });
    assert_eq!(left, 0, "freed blocks with key material");
}

/// Regression: a key list's base64 was decoded into a buffer that an
/// invalid key (past its first characters) dropped without erasing it.
#[test]
fn key_lists_good_and_bad_leave_no_key_in_freed_memory() {
    let list = format!("*1:{}, 2:{}\n3:{}", BASE64[0], BASE64[1], BASE64[2]);
    let mut bad = BASE64[2].to_string();
    bad.replace_range(40..41, "!");
    let bad = format!("1:{}, 2:{bad}", BASE64[0]);
    let left = left_behind(|| {
        let ring = KeyRing::parse(&list).expect("a ring");
        assert_eq!(ring.writer_id(), 1);
        drop(ring);
        assert!(KeyRing::parse(&bad).is_err());
    });
    assert_eq!(left, 0, "freed blocks with key material");
}

#[test]
fn a_ring_from_the_environment_leaves_no_key_in_freed_memory() {
    let var = "ONEFILL_TEST_KEY_ERASURE_KEYS";
    std::env::set_var(var, format!("1:{},2:{}", BASE64[0], BASE64[1]));
    let left = left_behind(|| {
        let ring = KeyRing::from_env(var).expect("a ring");
        drop(ring);
    });
    std::env::remove_var(var);
    assert_eq!(left, 0, "freed blocks with key material");
}

/// Regression: a variable that is not UTF-8 (a stray byte after the keys)
/// was refused, and its text, keys included, dropped without erasure.
#[cfg(unix)]
#[test]
fn a_variable_that_is_not_utf8_leaves_no_key_in_freed_memory() {
    use std::os::unix::ffi::OsStrExt;
    let var = "ONEFILL_TEST_KEY_ERASURE_NOT_UTF8";
    let mut text = format!("1:{}", BASE64[0]).into_bytes();
    text.push(0xFF);
    std::env::set_var(var, std::ffi::OsStr::from_bytes(&text));
    let left = left_behind(|| {
        assert_eq!(
            KeyRing::from_env(var).unwrap_err().to_string(),
            format!("environment variable {var} is not valid UTF-8")
        );
    });
    std::env::remove_var(var);
    assert_eq!(left, 0, "freed blocks with key material");
}

/// Encrypting and decrypting copy no key to the heap either; and the keys
/// above are the ones their base64 says (so the other tests look for the
/// right bytes).
#[test]
fn encrypting_leaves_no_key_in_freed_memory() {
    let from_text = KeyRing::parse(&format!("1:{}", BASE64[0])).expect("a ring");
    let left = left_behind(|| {
        let codec = Encrypted::new(JsonCodec, KeyRing::new(1, &KEY_1));
        let bytes = Codec::<String>::encode(&codec, "ns:{k}", &"v".to_string()).expect("encode");
        let read = Encrypted::new(JsonCodec, from_text);
        let back: String = Codec::decode(&read, "ns:{k}", &bytes).expect("the same key");
        assert_eq!(back, "v");
    });
    assert_eq!(left, 0, "freed blocks with key material");
}
