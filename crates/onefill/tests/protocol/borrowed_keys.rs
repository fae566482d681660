//! Borrowed lookups: a `Cache<String, _>` takes `"42"` as
//! `HashMap::get` would (`K: Borrow<Q>`), in every keyed call; the loader
//! still receives the owned key; `&key` with the cache's own `K` still
//! works; and an L1 hit through a borrowed key allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::{Cache, MemoryBackend, Outcome, L1};

/// Counts this thread's allocations, to check the L1 hit path.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

fn cache(l1: bool) -> Cache<String, String> {
    let builder = Cache::builder()
        .namespace("borrowed")
        .backend(MemoryBackend::new())
        .ttl(Duration::from_secs(60));
    let builder = if l1 {
        builder.l1(L1::new(100))
    } else {
        builder.no_l1()
    };
    builder.build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_str_finds_what_a_string_stored_in_every_call() {
    let c = cache(false);
    let loads = Arc::new(AtomicUsize::new(0));
    let counted = |loads: Arc<AtomicUsize>| {
        move |key: String| async move {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(format!("user {key}"))
        }
    };
    // The loader gets the owned key.
    let v = c.get_or_load("42", counted(loads.clone())).await.unwrap();
    assert_eq!(v, "user 42");
    // The same entry, through a `&String` and a `&str`, in every call.
    let owned = "42".to_string();
    let v = c.get_or_load(&owned, counted(loads.clone())).await.unwrap();
    assert_eq!(v, "user 42");
    let f = c.fetch("42", counted(loads.clone())).await.unwrap();
    assert_eq!(f.outcome, Outcome::Hit);
    let v = c.get_or_load("42", counted(loads.clone())).await.unwrap();
    assert_eq!(v, "user 42");
    assert_eq!(c.get("42").await.unwrap().as_deref(), Some("user 42"));
    assert_eq!(loads.load(Ordering::SeqCst), 1);

    c.set("42", "set".to_owned()).await.unwrap();
    assert_eq!(c.get(&owned).await.unwrap().as_deref(), Some("set"));
    c.invalidate("42").await.unwrap();
    assert_eq!(c.get(&owned).await.unwrap(), None);

    let absent = c
        .get_or_load_optional("404", |_| async { Ok::<_, std::io::Error>(None) })
        .await
        .unwrap();
    assert_eq!(absent, None);
    let f = c
        .fetch_optional("404", |_| async {
            Ok::<_, std::io::Error>(Some("x".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!((f.value, f.outcome), (None, Outcome::Hit));
}

/// Integer keys still infer from a literal, as with `HashMap::get(&1)`.
#[tokio::test(start_paused = true)]
async fn owned_keys_still_work() {
    let c = Cache::<u64, u64>::builder().build().unwrap();
    let v = c
        .get_or_load(&7, |k| async move { Ok::<_, std::io::Error>(k * 2) })
        .await
        .unwrap();
    assert_eq!(v, 14);
    assert_eq!(c.get(&7).await.unwrap(), Some(14));
}

/// The L1 hit path through a borrowed key: no owned key is made, nothing
/// is allocated.
#[tokio::test(flavor = "current_thread")]
async fn an_l1_hit_through_a_str_allocates_nothing() {
    let c = cache(true);
    let load = |key: String| async move { Ok::<_, std::io::Error>(key) };
    c.get_or_load("42", load).await.unwrap();
    // Warm whatever is lazily set up on first use.
    c.get_or_load("42", load).await.unwrap();
    let before = allocations();
    for _ in 0..10 {
        let v = c.get_or_load("42", load).await.unwrap();
        drop(v);
    }
    let after = allocations();
    // Each hit clones the `String` value itself (one allocation): the key
    // costs nothing.
    assert_eq!(
        after - before,
        10,
        "one allocation per hit: the value's clone"
    );
    assert_eq!(c.stats().loads_ok, 1);
}
