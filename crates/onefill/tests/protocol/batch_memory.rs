//! The batch call (`get_or_load_many`, `fetch_many`) on the embedded
//! backend, in paused time: several caches on one `MemoryBackend` (each
//! behind its own call counter) stand for processes sharing one Redis.
//!
//! Longer than most files on purpose: a batch drives the single call's
//! protocol for many keys, so every step a single call has (reads, leases,
//! waits, loads, fills, the L1, faults per shard) has its batch case here,
//! next to the others, where a drift between the two paths shows.

#[allow(unused)]
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::batch_support::{cache_in, count_calls, Counting, Counts, Origin};
use onefill::backend::{FillKeys, MAX_PIPELINE};
use onefill::{Cache, CallOptions, Error, InputError, MemoryBackend, OnWaitTimeout, Outcome};

const NS: &str = "batch";
const SECOND: Duration = Duration::from_secs(1);

fn process(backend: &MemoryBackend) -> (Cache<String, String>, Counting<MemoryBackend>) {
    let counting = count_calls(backend.clone());
    let cache = cache_in(NS, counting.clone(), |b| {
        b.ttl(Duration::from_secs(60)).jitter(0.0)
    });
    (cache, counting)
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

fn lock_of(key: &str) -> String {
    FillKeys::new(NS, key).lock().to_owned()
}

#[tokio::test(start_paused = true)]
async fn a_cold_batch_is_one_read_one_lease_request_one_load() {
    let backend = MemoryBackend::new();
    let (cache, counting) = process(&backend);
    let origin = Origin::default();
    let wanted = keys(10);

    let found = cache
        .get_or_load_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert_eq!(found.len(), 10);
    assert!(wanted.iter().all(|k| found[k] == format!("v{k}")));
    assert_eq!(origin.calls(), 1);
    assert_eq!(
        origin.loaded.lock().clone(),
        wanted,
        "each key once, in order"
    );
    assert_eq!(counting.of("get_many"), 1);
    assert_eq!(counting.of("acquire_many"), 1);
    assert_eq!(counting.of("get") + counting.of("acquire"), 0);
    assert_eq!(
        counting.of("fill"),
        10,
        "each key filled fenced on its own lease"
    );
    for k in &wanted {
        assert!(backend.get_raw(&lock_of(k)).is_none(), "no lease left");
    }

    // Again, from another process: one read, no load.
    let (other, other_counting) = process(&backend);
    let again = other
        .fetch_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(again
        .values()
        .all(|a| a.as_ref().unwrap().outcome == Outcome::Hit));
    assert_eq!(origin.calls(), 1);
    assert_eq!(other_counting.round_trips(), 1);

    // And again from the second process's L1 (it kept what it read, as a
    // single call does): no backend call at all.
    other_counting.reset();
    let l1 = other
        .fetch_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(l1
        .values()
        .all(|a| a.as_ref().unwrap().outcome == Outcome::Hit));
    assert_eq!(other_counting.round_trips(), 0);
    assert_eq!(other.stats().l1_hits, 10);
}

#[tokio::test(start_paused = true)]
async fn no_keys_no_work_and_duplicates_are_loaded_once() {
    let backend = MemoryBackend::new();
    let (cache, counting) = process(&backend);
    let origin = Origin::default();

    let none = cache
        .get_or_load_many(&[], origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(none.is_empty());
    assert_eq!((origin.calls(), counting.round_trips()), (0, 0));

    let dup = vec![
        "a".to_owned(),
        "b".to_owned(),
        "a".to_owned(),
        "a".to_owned(),
    ];
    let found = cache
        .get_or_load_many(&dup, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(origin.loaded.lock().clone(), vec!["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_key_fails_the_call_before_any_io_or_only_itself_in_fetch_many() {
    let backend = MemoryBackend::new();
    let (cache, counting) = process(&backend);
    let origin = Origin::default();
    let bad = vec!["ok".to_owned(), String::new(), "x".repeat(100_000)];

    let err = cache
        .get_or_load_many(&bad, origin.loader(SECOND, &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(InputError::EmptyKey)));
    assert_eq!((origin.calls(), counting.round_trips()), (0, 0));

    let answers = cache
        .fetch_many(&bad, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert_eq!(
        answers["ok"].as_ref().unwrap().value.as_deref(),
        Some("vok")
    );
    assert!(matches!(
        answers[""],
        Err(Error::InvalidInput(InputError::EmptyKey))
    ));
    assert!(matches!(
        answers[&"x".repeat(100_000)],
        Err(Error::InvalidInput(InputError::KeyTooLong { .. }))
    ));
    assert_eq!(origin.loaded.lock().clone(), vec!["ok"]);

    let bad_options = CallOptions::new().ttl(Duration::ZERO);
    assert!(matches!(
        cache
            .with_options(&bad_options)
            .fetch_many(&bad, origin.loader(SECOND, &[]))
            .await,
        Err(Error::InvalidInput(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_key_the_loader_does_not_return_is_a_cached_absence() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let origin = Origin::default();
    let wanted = vec!["here".to_owned(), "gone".to_owned()];

    let found = cache
        .get_or_load_many(&wanted, origin.loader(SECOND, &["gone"]))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found["here"], "vhere");

    let (other, _) = process(&backend);
    let answers = other
        .fetch_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    let gone = answers["gone"].as_ref().unwrap();
    assert_eq!((gone.value.clone(), gone.outcome), (None, Outcome::Hit));
    assert_eq!(origin.calls(), 1, "the absence was cached");
    // The single-key optional call sees the same absence.
    let single = other
        .get_or_load_optional(&"gone".to_owned(), |_| async {
            Ok::<_, std::io::Error>(Some("no".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(single, None);
}

#[tokio::test(start_paused = true)]
async fn a_failing_loader_fails_every_key_it_loaded_and_releases_every_lease() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let wanted = keys(5);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let err = cache
        .get_or_load_many(&wanted, move |_keys: Vec<String>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Err::<Vec<(String, String)>, _>(std::io::Error::other("db down")) }
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Loader(_)), "{err:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    for k in &wanted {
        assert!(
            backend.get_raw(&lock_of(k)).is_none(),
            "lease of {k} released"
        );
        assert!(backend.get_raw(FillKeys::new(NS, k).value()).is_none());
    }

    // A panic: every key gets LoaderPanicked, no lease stays.
    let answers = cache
        .fetch_many(&wanted, |_keys: Vec<String>| async {
            if true {
                panic!("loader bug");
            }
            Ok::<Vec<(String, String)>, std::io::Error>(Vec::new())
        })
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| matches!(a, Err(Error::LoaderPanicked(m)) if m == "loader bug")));
    for k in &wanted {
        assert!(backend.get_raw(&lock_of(k)).is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn negative_caching_and_fail_safe_apply_per_key_as_for_single_calls() {
    let backend = MemoryBackend::new();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.ttl(Duration::from_secs(10))
            .grace(Duration::from_secs(60))
            .negative_ttl(Duration::from_secs(5))
            .jitter(0.0)
    });
    let origin = Origin::default();
    // "old" has a value that will be stale; "new" has none.
    cache
        .get_or_load_many(&["old".to_owned()], origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;

    let failing = |_keys: Vec<String>| async {
        Err::<Vec<(String, String)>, _>(std::io::Error::other("db down"))
    };
    let answers = cache
        .fetch_many(&["old".to_owned(), "new".to_owned()], failing)
        .await
        .unwrap();
    // In grace: served stale at once (the refresh fails in the background).
    let old = answers["old"].as_ref().unwrap();
    assert_eq!(
        (old.value.as_deref(), old.outcome),
        (Some("vold"), Outcome::Stale)
    );
    assert!(matches!(answers["new"], Err(Error::Loader(_))));
    // The failure of "new" is remembered for the negative TTL.
    let again = cache
        .fetch_many(&["new".to_owned()], origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(matches!(again["new"], Err(Error::CachedFailure(_))));
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn four_processes_load_the_same_cold_keys_once_fleet_wide() {
    let backend = MemoryBackend::new();
    let processes: Vec<_> = (0..4).map(|_| process(&backend)).collect();
    let origin = Origin::default();
    let wanted = keys(100);

    let calls = processes.iter().map(|(cache, _)| {
        let cache = cache.clone();
        let wanted = wanted.clone();
        let loader = origin.loader(SECOND, &[]);
        tokio::spawn(async move { cache.get_or_load_many(&wanted, loader).await })
    });
    for call in calls.collect::<Vec<_>>() {
        let found = call.await.unwrap().unwrap();
        assert_eq!(found.len(), 100);
        assert!(wanted.iter().all(|k| found[k] == format!("v{k}")));
    }
    let per_key = origin.loads_per_key();
    assert_eq!(per_key.len(), 100);
    assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
    assert!(origin.calls() <= 4, "{} loader calls", origin.calls());

    // The hit path: each process reads all 100 keys again in one round
    // trip (a `get_many`; none for the keys its L1 kept), no load.
    for (cache, counting) in &processes {
        counting.reset();
        let found = cache
            .get_or_load_many(&wanted, origin.loader(SECOND, &[]))
            .await
            .unwrap();
        assert_eq!(found.len(), 100);
        assert!(counting.round_trips() <= 1, "{:?}", counting.faults());
    }
    assert!(origin.calls() <= 4);
}

#[tokio::test(start_paused = true)]
async fn keys_another_process_is_loading_are_waited_for() {
    let backend = MemoryBackend::new();
    let (a, _) = process(&backend);
    let (b, b_counting) = process(&backend);
    let origin = Origin::default();

    // A loads "x" (slowly), alone.
    let loading = {
        let a = a.clone();
        let loader = origin.loader(Duration::from_millis(4500), &[]);
        tokio::spawn(async move { a.get_or_load_many(&["x".to_owned()], loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;

    // B asks for x and y: loads y, waits for x.
    let answers = b
        .fetch_many(
            &["x".to_owned(), "y".to_owned()],
            origin.loader(SECOND, &[]),
        )
        .await
        .unwrap();
    let x = answers["x"].as_ref().unwrap();
    assert_eq!(
        (x.value.as_deref(), x.outcome),
        (Some("vx"), Outcome::Waited)
    );
    assert_eq!(answers["y"].as_ref().unwrap().outcome, Outcome::Loaded);
    assert_eq!(
        origin.loads_per_key(),
        HashMap::from([("x".into(), 1), ("y".into(), 1)])
    );
    assert!(loading.await.unwrap().is_ok());
    // The wait is batched too: re-checks are lease requests for the keys
    // due, the read after the notification a `get_many`; no single-key
    // step. (How many re-checks depends on when the holder's lease comes
    // due, not asserted.)
    assert_eq!(
        b_counting.of("acquire") + b_counting.of("get"),
        0,
        "{:?}",
        b_counting.faults()
    );
    assert_eq!(b_counting.of("get_many"), 2, "{:?}", b_counting.faults());
    assert_eq!(b.stats().waits, 1);
    assert_eq!(b.stats().wait_notified, 1);
}

#[tokio::test(start_paused = true)]
async fn a_dead_holder_is_taken_over_and_a_wait_is_bounded() {
    let backend = MemoryBackend::new();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.wait(
            onefill::WaitPolicy::default()
                .deadline(Duration::from_secs(2))
                .on_timeout(OnWaitTimeout::Error),
        )
    });
    let origin = Origin::default();
    // Dead processes' leases on "dead" and "dead2" (expire in 1 s), and a
    // live one that outlives the wait on "stuck".
    backend.put_raw(&lock_of("dead"), b"someone", SECOND);
    backend.put_raw(&lock_of("dead2"), b"someone", SECOND);
    backend.put_raw(&lock_of("stuck"), b"someone", Duration::from_secs(60));

    let asked: Vec<String> = ["dead", "dead2", "stuck", "free"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let answers = cache
        .fetch_many(&asked, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    assert_eq!(answers["dead"].as_ref().unwrap().outcome, Outcome::Loaded);
    assert_eq!(answers["dead2"].as_ref().unwrap().outcome, Outcome::Loaded);
    assert_eq!(answers["free"].as_ref().unwrap().outcome, Outcome::Loaded);
    assert!(matches!(answers["stuck"], Err(Error::WaitTimedOut(_))));
    // "free" in the batch's load; "dead" and "dead2", taken over at the
    // same re-check (their holders' expiry), in one more.
    assert_eq!(origin.calls(), 2);
    assert_eq!(origin.loaded.lock().clone(), vec!["free", "dead", "dead2"]);
    assert_eq!(origin.loads_per_key().get("stuck"), None);
    assert_eq!(cache.stats().wait_timeouts, 1);
    for k in ["dead", "dead2", "free"] {
        assert!(backend.get_raw(&lock_of(k)).is_none(), "lease of {k} left");
    }
}

#[tokio::test(start_paused = true)]
async fn at_the_wait_deadline_the_keys_are_loaded_together_unstored_by_default() {
    let backend = MemoryBackend::new();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.wait(onefill::WaitPolicy::default().deadline(Duration::from_secs(2)))
    });
    let origin = Origin::default();
    for k in ["a", "b"] {
        backend.put_raw(&lock_of(k), b"someone", Duration::from_secs(60));
    }
    let answers = cache
        .fetch_many(
            &["a".to_owned(), "b".to_owned()],
            origin.loader(Duration::ZERO, &[]),
        )
        .await
        .unwrap();
    for k in ["a", "b"] {
        let a = answers[k].as_ref().unwrap();
        assert_eq!(
            (a.value.clone(), a.outcome),
            (Some(format!("v{k}")), Outcome::Degraded)
        );
        assert!(
            backend.get_raw(FillKeys::new(NS, k).value()).is_none(),
            "not stored"
        );
    }
    assert_eq!(origin.calls(), 1, "both keys in one call");
    assert_eq!(cache.stats().wait_timeouts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_hangs_during_the_wait_degrades_the_keys_within_bounds() {
    use crate::support::{switched, Switches, HANG_FROM_THIRD};
    let backend = switched();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.backend_timeout(Duration::from_millis(100)).no_l1()
    });
    let origin = Origin::default();
    backend
        .store()
        .put_raw(&lock_of("held"), b"someone", Duration::from_secs(60));
    // The read and the lease request answer; the subscription and every
    // re-check hang.
    backend.set_mode(HANG_FROM_THIRD);
    let started = tokio::time::Instant::now();
    let answers = cache
        .fetch_many(&["held".to_owned()], origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    let held = answers["held"].as_ref().unwrap();
    assert_eq!(
        (held.value.as_deref(), held.outcome),
        (Some("vheld"), Outcome::Degraded)
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_batch_and_a_single_call_on_one_key_share_one_load() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let origin = Origin::default();
    let single_loads = Arc::new(AtomicUsize::new(0));

    // A single call is loading "a".
    let single = {
        let cache = cache.clone();
        let loads = single_loads.clone();
        tokio::spawn(async move {
            cache
                .get_or_load(&"a".to_owned(), move |_| async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok::<_, std::io::Error>("single".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let answers = cache
        .fetch_many(
            &["a".to_owned(), "b".to_owned()],
            origin.loader(SECOND, &[]),
        )
        .await
        .unwrap();
    let a = answers["a"].as_ref().unwrap();
    assert_eq!((a.value.as_deref(), a.coalesced), (Some("single"), true));
    assert_eq!(
        origin.loaded.lock().clone(),
        vec!["b"],
        "the batch did not load a"
    );
    assert_eq!(single_loads.load(Ordering::SeqCst), 1);
    assert_eq!(single.await.unwrap().unwrap(), "single");

    // The other way round: a batch is loading; a single call joins it.
    let batch = {
        let cache = cache.clone();
        let loader = origin.loader(Duration::from_secs(2), &[]);
        tokio::spawn(async move {
            cache
                .get_or_load_many(&["c".to_owned(), "d".to_owned()], loader)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let c = cache
        .fetch(&"c".to_owned(), |_| async {
            Ok::<_, std::io::Error>("single".to_owned())
        })
        .await
        .unwrap();
    assert_eq!((c.value.as_str(), c.coalesced), ("vc", true));
    assert_eq!(batch.await.unwrap().unwrap().len(), 2);
    assert_eq!(origin.loads_per_key().get("c"), Some(&1));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_batch_still_loads_fills_and_leaves_no_lease() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let origin = Origin::default();
    let wanted = keys(3);

    let call = {
        let cache = cache.clone();
        let wanted = wanted.clone();
        let loader = origin.loader(Duration::from_secs(2), &[]);
        tokio::spawn(async move { cache.get_or_load_many(&wanted, loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(origin.calls(), 1, "loading");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // A caller that joins meanwhile gets the dropped batch's load.
    let joined = cache
        .fetch(&"k0".to_owned(), |_| async {
            Ok::<_, std::io::Error>("other".to_owned())
        })
        .await
        .unwrap();
    assert_eq!((joined.value.as_str(), joined.coalesced), ("vk0", true));
    for k in &wanted {
        assert!(backend.get_raw(&lock_of(k)).is_none(), "lease of {k} left");
    }
    let (other, _) = process(&backend);
    let found = other
        .get_or_load_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(origin.calls(), 1, "filled by the dropped batch");
}

#[tokio::test(start_paused = true)]
async fn a_huge_batch_is_chunked_for_the_backend_and_loaded_in_one_call() {
    let backend = MemoryBackend::new();
    let (cache, counting) = process(&backend);
    let origin = Origin::default();
    let n = MAX_PIPELINE * 2 + 500;
    let wanted = keys(n);
    let found = cache
        .get_or_load_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert_eq!(found.len(), n);
    assert_eq!(origin.calls(), 1);
    assert_eq!(counting.of("get_many"), 3);
    assert_eq!(counting.of("acquire_many"), 3);
}

#[tokio::test(start_paused = true)]
async fn a_loader_slower_than_the_maximum_load_time_is_cut_off() {
    let backend = MemoryBackend::new();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.max_load_time(Duration::from_secs(5))
    });
    let origin = Origin::default();
    let answers = cache
        .fetch_many(
            &["a".to_owned(), "b".to_owned()],
            origin.loader(Duration::from_secs(3600), &[]),
        )
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| matches!(a, Err(Error::LoadTimedOut(_)))));
    assert!(backend.get_raw(&lock_of("a")).is_none());
}

#[tokio::test(start_paused = true)]
async fn stale_keys_are_served_at_once_and_refreshed_together_in_the_background() {
    let backend = MemoryBackend::new();
    let build = || -> Cache<String, String> {
        cache_in(NS, backend.clone(), |b| {
            b.ttl(Duration::from_secs(10))
                .grace(Duration::from_secs(60))
                .jitter(0.0)
                .no_l1()
        })
    };
    let (cache, other) = (build(), build());
    let wanted = keys(10);
    let first = Origin::default();
    cache
        .get_or_load_many(&wanted, first.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;

    let refresh = Origin::default();
    let answers = cache
        .fetch_many(&wanted, refresh.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| a.as_ref().unwrap().outcome == Outcome::Stale));
    // Another process at the same moment: stale too, and no second refresh.
    let answers = other
        .fetch_many(&wanted, refresh.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| a.as_ref().unwrap().outcome == Outcome::Stale));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(refresh.calls(), 1, "one load refreshed every key");
    assert_eq!(refresh.loaded.lock().len(), 10);
    let answers = other
        .fetch_many(&wanted, refresh.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| a.as_ref().unwrap().outcome == Outcome::Hit));
    assert_eq!(cache.stats().background_refreshes, 10);
}

#[tokio::test(start_paused = true)]
async fn when_the_backend_fails_the_keys_are_loaded_together_unstored() {
    use crate::support::{switched, Switches, HANG, REFUSE};
    let backend = switched();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.backend_timeout(Duration::from_millis(100)).no_l1()
    });
    let origin = Origin::default();
    let wanted = keys(15);
    cache
        .get_or_load_many(&wanted[..5], origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();

    for (mode, new) in [(REFUSE, 5..10), (HANG, 10..15)] {
        backend.set_mode(mode);
        let calls = origin.calls();
        let asked: Vec<String> = wanted[..5]
            .iter()
            .chain(&wanted[new.clone()])
            .cloned()
            .collect();
        let answers = cache
            .fetch_many(&asked, origin.loader(SECOND, &[]))
            .await
            .unwrap();
        // The five read before: their last-known values (outage fallback).
        for k in &wanted[..5] {
            let a = answers[k].as_ref().unwrap();
            assert_eq!(
                (a.value.clone(), a.outcome),
                (Some(format!("v{k}")), Outcome::Stale)
            );
        }
        // The five never read: loaded without a lease, in one call.
        for k in &wanted[new] {
            let a = answers[k].as_ref().unwrap();
            assert_eq!(a.outcome, Outcome::Degraded, "{mode:?}");
        }
        assert_eq!(
            origin.calls(),
            calls + 1,
            "one loader call in mode {mode:?}"
        );
    }
    backend.set_mode(crate::support::HEALTHY);
    assert!(wanted[5..].iter().all(|k| backend
        .store()
        .get_raw(FillKeys::new(NS, k).value())
        .is_none()));

    // Strict mode: the backend's error, for each key.
    backend.set_mode(REFUSE);
    let strict = CallOptions::new().strict(true);
    let answers = cache
        .with_options(&strict)
        .fetch_many(&wanted, origin.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| matches!(a, Err(Error::Backend(_)))));
}

#[tokio::test(start_paused = true)]
async fn without_the_lease_policy_held_keys_are_loaded_unstored_not_waited_for() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let origin = Origin::default();
    backend.put_raw(&lock_of("held"), b"someone", Duration::from_secs(60));
    let answers = cache
        .with_options(&CallOptions::new().no_lease())
        .fetch_many(
            &["held".to_owned(), "free".to_owned(), "free2".to_owned()],
            origin.loader(SECOND, &[]),
        )
        .await
        .unwrap();
    let held = answers["held"].as_ref().unwrap();
    assert_eq!(
        (held.value.as_deref(), held.outcome),
        (Some("vheld"), Outcome::Degraded)
    );
    assert_eq!(answers["free"].as_ref().unwrap().outcome, Outcome::Loaded);
    // "free" stored under the lease it took; "held" left to its holder.
    assert!(backend.get_raw(FillKeys::new(NS, "free").value()).is_some());
    assert!(backend.get_raw(FillKeys::new(NS, "held").value()).is_none());
    assert_eq!(
        backend.get_raw(&lock_of("held")).map(|(b, _)| b),
        Some(b"someone".to_vec())
    );
    assert_eq!(
        origin.loads_per_key(),
        HashMap::from([("held".into(), 1), ("free".into(), 1), ("free2".into(), 1)])
    );
    // One call for the keys won and the key loaded unstored.
    assert_eq!(origin.calls(), 1);
    assert_eq!(cache.stats().waits, 0);
}

#[tokio::test(start_paused = true)]
async fn a_set_during_the_batch_load_fences_its_fill_and_extra_pairs_are_ignored() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let (writer, _) = process(&backend);
    let loading = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .fetch_many(
                    &["a".to_owned(), "b".to_owned()],
                    |keys: Vec<String>| async move {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        let mut found: Vec<(String, String)> =
                            keys.into_iter().map(|k| (k, "old".to_owned())).collect();
                        // Not asked for: ignored, not stored.
                        found.push(("extra".to_owned(), "x".to_owned()));
                        Ok::<_, std::io::Error>(found)
                    },
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    writer.set(&"a".to_owned(), "new".to_owned()).await.unwrap();
    let answers = loading.await.unwrap().unwrap();
    // The batch's callers get what the loader found...
    assert_eq!(answers["a"].as_ref().unwrap().value.as_deref(), Some("old"));
    assert_eq!(answers.len(), 2);
    // ...but the write that came after the load started stays.
    let (reader, _) = process(&backend);
    assert_eq!(
        reader.get(&"a".to_owned()).await.unwrap().as_deref(),
        Some("new")
    );
    assert_eq!(
        reader.get(&"b".to_owned()).await.unwrap().as_deref(),
        Some("old")
    );
    assert!(backend
        .get_raw(FillKeys::new(NS, "extra").value())
        .is_none());
    assert_eq!(cache.stats().lease_lost, 1);
}

#[tokio::test(start_paused = true)]
async fn keys_with_braces_newlines_and_unicode_are_batched_like_any_other() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let origin = Origin::default();
    let odd: Vec<String> = ["}a{", "{b}", "line\nbreak", "ключ", "}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let found = cache
        .get_or_load_many(&odd, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    assert!(odd.iter().all(|k| found[k] == format!("v{k}")));
    let (other, counting) = process(&backend);
    let again = other
        .get_or_load_many(&odd, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    assert_eq!(again, found);
    assert_eq!((origin.calls(), counting.round_trips()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn stale_keys_in_the_l1_are_served_without_a_round_trip_and_refreshed_together() {
    let backend = MemoryBackend::new();
    let counting = count_calls(backend.clone());
    let build = |b: Counting<MemoryBackend>| -> Cache<String, String> {
        cache_in(NS, b, |b| {
            b.ttl(Duration::from_secs(10))
                .grace(Duration::from_secs(60))
                .jitter(0.0)
        })
    };
    let (writer, reader) = (build(count_calls(backend.clone())), build(counting.clone()));
    let wanted = keys(5);
    let first = Origin::default();
    writer
        .get_or_load_many(&wanted, first.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    // The reader reads them once: its L1 keeps them.
    reader
        .get_or_load_many(&wanted, first.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;

    counting.reset();
    let refresh = Origin::default();
    let answers = reader
        .fetch_many(&wanted, refresh.loader(SECOND, &[]))
        .await
        .unwrap();
    assert!(answers
        .values()
        .all(|a| a.as_ref().unwrap().outcome == Outcome::Stale));
    assert_eq!(counting.of("get_many"), 0, "served from the L1");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(refresh.calls(), 1, "one load refreshed every key");
    assert_eq!(refresh.loaded.lock().len(), 5);
    assert_eq!(counting.of("acquire_many"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_batch_dropped_while_it_waits_still_answers_the_keys_other_callers() {
    let backend = MemoryBackend::new();
    let (a, _) = process(&backend);
    let (b, _) = process(&backend);
    let origin = Origin::default();
    let loading = {
        let loader = origin.loader(Duration::from_secs(2), &[]);
        tokio::spawn(async move { a.get_or_load_many(&["x".to_owned()], loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiting = {
        let b = b.clone();
        let loader = origin.loader(SECOND, &[]);
        tokio::spawn(async move { b.get_or_load_many(&["x".to_owned()], loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // A single call in B joins the flight the dropped batch leads.
    let x = b
        .fetch(&"x".to_owned(), |_| async {
            Ok::<_, std::io::Error>("mine".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(
        (x.value.as_str(), x.outcome, x.coalesced),
        ("vx", Outcome::Waited, true)
    );
    assert!(loading.await.unwrap().is_ok());
    assert_eq!(origin.calls(), 1);
    assert_eq!(b.stats().waits, 1);
}

/// Batches against a master that hangs (as two masters of a cluster), keys
/// returned twice, a dropped batch, absent keys with the L1, batches racing
/// single calls, and the soft timeout.
mod hung_masters_and_races {

    use std::time::Duration;

    use crate::batch_support::{cache_in, Origin};

    use onefill::backend::FillKeys;
    use onefill::testing::{Fault, FaultyBackend, Op};
    use onefill::{Cache, CallOptions, MemoryBackend, Outcome};

    const NS: &str = "masters";

    /// Two shards (as two masters of a cluster): keys containing `bad` live on
    /// shard 1, which hangs when told to ([`hang_bad`]). Every command takes a
    /// millisecond (a round trip), as on a real server.
    fn two_masters() -> FaultyBackend<MemoryBackend> {
        let backend = FaultyBackend::new(MemoryBackend::new())
            .with_shards(|keys| u64::from(keys.value().contains("bad")));
        backend.faults().set_latency(Duration::from_millis(1));
        backend
    }

    /// Shard 1 hangs on every call.
    fn hang_bad(backend: &FaultyBackend<MemoryBackend>) {
        backend.faults().set_for_keys("bad", Op::ALL, Fault::Hang);
    }

    /// Shard 1 answers reads but hangs on lease requests.
    fn hang_bad_acquire(backend: &FaultyBackend<MemoryBackend>) {
        backend
            .faults()
            .set_for_keys("bad", [Op::Acquire, Op::AcquireMany], Fault::Hang);
    }

    fn value_of(key: &str) -> String {
        FillKeys::new(NS, key).value().to_owned()
    }

    /// One master hangs: the batch's keys on the other master must still be
    /// leased, loaded once and stored, as a single call stores them. The
    /// failing master's read timeout must not be charged to the healthy
    /// master's keys.
    #[tokio::test(start_paused = true)]
    async fn a_hung_master_does_not_stop_the_keys_of_a_healthy_one_being_stored() {
        let backend = two_masters();
        let cache = cache_in(NS, backend.clone(), |b| {
            b.backend_timeout(Duration::from_millis(100)).no_l1()
        });
        let origin = Origin::default();
        hang_bad(&backend);

        // A single call on the healthy master, for reference: loaded, stored.
        let single = cache
            .fetch(&"good0".to_owned(), |k: String| async move {
                Ok::<_, std::io::Error>(format!("v{k}"))
            })
            .await
            .unwrap();
        assert_eq!(single.outcome, Outcome::Loaded);
        assert!(backend.inner().get_raw(&value_of("good0")).is_some());

        let wanted: Vec<String> = ["good1", "good2", "bad1"].map(String::from).to_vec();
        let answers = cache
            .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        for good in ["good1", "good2"] {
            let answer = answers[good].as_ref().unwrap();
            assert_eq!(
                (answer.value.as_deref(), answer.outcome),
                (Some(format!("v{good}").as_str()), Outcome::Loaded),
                "{good}: {answers:?}"
            );
            assert!(
                backend.inner().get_raw(&value_of(good)).is_some(),
                "{good} stored"
            );
        }
        // The hung master's key: loaded without the lease (degraded).
        let bad = answers["bad1"].as_ref().unwrap();
        assert_eq!(bad.outcome, Outcome::Degraded);
    }

    fn lock_of(key: &str) -> String {
        FillKeys::new(NS, key).lock().to_owned()
    }

    /// One master hangs on the lease request (its read answered): the keys
    /// won on the healthy master must still be filled (their own budget is
    /// whole), and no lease is left behind.
    #[tokio::test(start_paused = true)]
    async fn a_master_hanging_on_the_lease_request_does_not_stop_the_fills_of_the_others() {
        let backend = two_masters();
        let cache = cache_in(NS, backend.clone(), |b| {
            b.backend_timeout(Duration::from_millis(100)).no_l1()
        });
        let origin = Origin::default();
        hang_bad_acquire(&backend);

        let wanted: Vec<String> = ["good1", "good2", "bad1"].map(String::from).to_vec();
        let answers = cache
            .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        for good in ["good1", "good2"] {
            let answer = answers[good].as_ref().unwrap();
            assert_eq!(answer.outcome, Outcome::Loaded, "{good}: {answers:?}");
            assert!(
                backend.inner().get_raw(&value_of(good)).is_some(),
                "{good} stored: {answers:?}"
            );
            assert!(
                backend.inner().get_raw(&lock_of(good)).is_none(),
                "{good}: no lease left"
            );
        }
        assert_eq!(origin.calls(), 1, "one load");
    }

    /// Stale keys served by a batch are refreshed in the background; a hung
    /// master in the same batch must not stop the healthy master's refresh
    /// from being stored (nor leave its lease behind).
    #[tokio::test(start_paused = true)]
    async fn a_hung_master_does_not_stop_the_refresh_of_stale_keys_on_a_healthy_one() {
        let backend = two_masters();
        let cache = cache_in(NS, backend.clone(), |b| {
            b.backend_timeout(Duration::from_millis(100))
                .ttl(Duration::from_secs(10))
                .grace(Duration::from_secs(60))
                .jitter(0.0)
                .no_l1()
        });
        let wanted: Vec<String> = ["good1", "bad1"].map(String::from).to_vec();
        let first = Origin::default();
        cache
            .get_or_load_many(&wanted, first.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        hang_bad(&backend);

        let refresh = Origin::default();
        let answers = cache
            .fetch_many(&wanted, refresh.loader(Duration::from_secs(1), &[]))
            .await
            .unwrap();
        let good = answers["good1"].as_ref().unwrap();
        assert_eq!(good.outcome, Outcome::Stale, "{answers:?}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(refresh.loads_per_key().get("good1"), Some(&1), "refreshed");
        let (_, ttl) = backend.inner().get_raw(&value_of("good1")).unwrap();
        assert!(
            ttl > Duration::from_secs(60),
            "the refreshed value is stored (ttl + grace left: {ttl:?})"
        );
        assert!(
            backend.inner().get_raw(&lock_of("good1")).is_none(),
            "no lease left"
        );
    }

    /// A loader returning a key twice (a join yielding two rows for one id):
    /// the batch's first load and a single key's load (a takeover, a
    /// refresh) must keep the same pair, the first, whichever path loads it.
    #[tokio::test(start_paused = true)]
    async fn a_key_returned_twice_keeps_its_first_pair_on_every_path() {
        let backend = MemoryBackend::new();
        let cache = cache_in(NS, backend.clone(), |b| {
            b.ttl(Duration::from_secs(10))
                .grace(Duration::from_secs(60))
                .jitter(0.0)
                .no_l1()
        });
        let twice = |keys: Vec<String>| async move {
            let mut rows = Vec::new();
            for k in keys {
                rows.push((k.clone(), format!("first {k}")));
                rows.push((k.clone(), format!("second {k}")));
            }
            Ok::<_, std::io::Error>(rows)
        };
        let wanted = vec!["a".to_owned(), "b".to_owned()];
        let found = cache.get_or_load_many(&wanted, twice).await.unwrap();
        assert_eq!(found["a"], "first a", "the batch load");

        // The stale value's background refresh of one key alone: the single
        // key's load of the batch loader.
        tokio::time::advance(Duration::from_secs(11)).await;
        let _ = cache
            .get_or_load_many(&["a".to_owned()], twice)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let found = cache.get_or_load_many(&wanted, twice).await.unwrap();
        assert_eq!(found["a"], "first a", "the refresh");
    }

    /// Strict mode, one master hung: its keys fail with the backend's error
    /// (nothing loaded for them), the healthy master's keys are loaded and
    /// stored, and the call is bounded by the backend timeout (plus the load).
    #[tokio::test(start_paused = true)]
    async fn strict_mode_fails_only_the_hung_masters_keys_within_the_backend_timeout() {
        let backend = two_masters();
        let cache = cache_in(NS, backend.clone(), |b| {
            b.backend_timeout(Duration::from_millis(100))
                .strict(true)
                .no_l1()
        });
        let origin = Origin::default();
        hang_bad(&backend);
        let started = tokio::time::Instant::now();
        let wanted: Vec<String> = ["good1", "bad1"].map(String::from).to_vec();
        let answers = cache
            .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        assert!(
            matches!(answers["bad1"], Err(onefill::Error::Backend(_))),
            "{answers:?}"
        );
        let good = answers["good1"].as_ref().unwrap();
        assert_eq!(good.outcome, Outcome::Loaded, "{answers:?}");
        assert!(backend.inner().get_raw(&value_of("good1")).is_some());
        assert_eq!(origin.loaded.lock().clone(), vec!["good1".to_owned()]);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        // And get_or_load_many answers the hung master's error.
        let all = cache
            .get_or_load_many(&wanted, origin.loader(Duration::ZERO, &[]))
            .await;
        assert!(matches!(all, Err(onefill::Error::Backend(_))), "{all:?}");
    }

    /// A batch dropped while its read hangs: a single call on the same key
    /// joins the batch's flight and is answered (the batch's task goes on);
    /// nothing is left leased.
    #[tokio::test(start_paused = true)]
    async fn a_batch_dropped_during_a_hung_read_still_answers_a_single_caller() {
        let backend = two_masters();
        let cache = cache_in(NS, backend.clone(), |b| {
            b.backend_timeout(Duration::from_millis(100)).no_l1()
        });
        let origin = Origin::default();
        hang_bad(&backend);
        let batch = {
            let cache = cache.clone();
            let loader = origin.loader(Duration::ZERO, &[]);
            tokio::spawn(async move { cache.get_or_load_many(&["bad1".to_owned()], loader).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        batch.abort();
        let single = cache
            .fetch(&"bad1".to_owned(), |k: String| async move {
                Ok::<_, std::io::Error>(format!("single {k}"))
            })
            .await
            .unwrap();
        assert!(single.coalesced, "joined the dropped batch's flight");
        assert_eq!(single.value, "vbad1");
        assert_eq!(origin.calls(), 1);
        backend.faults().clear();
        assert!(backend.inner().get_raw(&lock_of("bad1")).is_none());
    }

    /// A key the loader does not return is absent for `negative_ttl`, not
    /// `ttl`, in the backend and in the L1 of the process that loaded it and
    /// of another that read it.
    #[tokio::test(start_paused = true)]
    async fn an_absent_key_is_asked_again_after_the_negative_ttl_with_the_l1_on() {
        let backend = MemoryBackend::new();
        let build = || -> Cache<String, String> {
            cache_in(NS, backend.clone(), |b| {
                b.ttl(Duration::from_secs(60))
                    .negative_ttl(Duration::from_secs(5))
                    .jitter(0.0)
                    .l1(onefill::L1::new(100))
            })
        };
        let (cache, other) = (build(), build());
        let origin = Origin::default();
        let wanted = vec!["here".to_owned(), "gone".to_owned()];
        let found = cache
            .get_or_load_many(&wanted, origin.loader(Duration::ZERO, &["gone"]))
            .await
            .unwrap();
        assert!(!found.contains_key("gone"));
        let read = other
            .fetch_many(&wanted, origin.loader(Duration::ZERO, &["gone"]))
            .await
            .unwrap();
        assert_eq!(read["gone"].as_ref().unwrap().outcome, Outcome::Hit);
        assert_eq!(origin.calls(), 1);

        tokio::time::advance(Duration::from_secs(6)).await;
        for process in [&cache, &other] {
            let again = process
                .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
                .await
                .unwrap();
            assert_eq!(
                again["gone"].as_ref().unwrap().value.as_deref(),
                Some("vgone"),
                "absence expired after negative_ttl: {again:?}"
            );
            assert_eq!(again["here"].as_ref().unwrap().outcome, Outcome::Hit);
        }
        assert_eq!(
            origin.loads_per_key().get("gone"),
            Some(&2),
            "loaded again once"
        );
        assert_eq!(origin.loads_per_key().get("here"), Some(&1));
    }

    /// Batches (keys in both orders) and single calls racing on overlapping
    /// keys on a multi-threaded runtime: one process never loads a key twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_and_single_calls_racing_on_overlapping_keys_load_each_key_once() {
        for round in 0..30 {
            let cache = cache_in(NS, MemoryBackend::new(), |b| b);
            let origin = Origin::default();
            let forward: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
            let backward: Vec<String> = forward.iter().rev().cloned().collect();
            let mut calls = Vec::new();
            for wanted in [forward.clone(), backward, forward[2..6].to_vec()] {
                let cache = cache.clone();
                let loader = origin.loader(Duration::from_millis(2), &[]);
                calls.push(tokio::spawn(async move {
                    let found = cache.get_or_load_many(&wanted, loader).await.unwrap();
                    assert_eq!(found.len(), wanted.len());
                }));
            }
            for key in forward.iter().step_by(2) {
                let cache = cache.clone();
                let key = key.clone();
                let origin = origin.clone();
                calls.push(tokio::spawn(async move {
                    let loaded = cache
                        .get_or_load(&key, move |k: String| async move {
                            origin.loaded.lock().push(k.clone());
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            Ok::<_, std::io::Error>(format!("v{k}"))
                        })
                        .await
                        .unwrap();
                    assert_eq!(loaded, format!("v{key}"));
                }));
            }
            for call in calls {
                call.await.unwrap();
            }
            let per_key = origin.loads_per_key();
            assert!(
                per_key.values().all(|n| *n == 1) && per_key.len() == 8,
                "round {round}: {per_key:?}"
            );
        }
    }

    /// `soft_timeout` does not apply to a batch's own load (documented): a
    /// cold batch slower than the soft timeout waits for its load and stores
    /// every key.
    #[tokio::test(start_paused = true)]
    async fn a_soft_timeout_does_not_cut_a_batchs_own_load() {
        let backend = MemoryBackend::new();
        let cache = cache_in(NS, backend.clone(), |b| b.no_l1());
        let origin = Origin::default();
        let wanted = vec!["a".to_owned(), "b".to_owned()];
        let answers = cache
            .with_options(&CallOptions::new().soft_timeout(Duration::from_millis(10)))
            .fetch_many(&wanted, origin.loader(Duration::from_secs(1), &[]))
            .await
            .unwrap();
        for k in &wanted {
            let answer = answers[k].as_ref().unwrap();
            assert_eq!(answer.outcome, Outcome::Loaded, "{answers:?}");
            assert!(backend.get_raw(&value_of(k)).is_some());
        }
        assert_eq!(origin.calls(), 1);
    }
}

/// Each key of a batch runs the single call's protocol: a key whose holder
/// died is taken over, and counted as a takeover, as a single call counts
/// it.
#[tokio::test(start_paused = true)]
async fn a_batch_counts_a_dead_holders_takeover_as_a_single_call_does() {
    let backend = MemoryBackend::new();
    let (cache, _) = process(&backend);
    let origin = Origin::default();
    backend.put_raw(&lock_of("dead"), b"someone", SECOND);
    backend.put_raw(&lock_of("dead2"), b"someone", SECOND);
    let asked = vec!["dead".to_owned(), "dead2".to_owned(), "free".to_owned()];
    let found = cache
        .get_or_load_many(&asked, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    assert_eq!(found.len(), 3);
    let stats = cache.stats();
    assert_eq!((stats.lease_takeovers, stats.waits), (2, 2), "{stats:?}");

    // The same, one key at a time.
    let (single, _) = process(&backend);
    backend.put_raw(&lock_of("dead3"), b"someone", SECOND);
    single
        .get_or_load(&"dead3".to_owned(), |k| async move {
            Ok::<_, std::io::Error>(format!("v{k}"))
        })
        .await
        .unwrap();
    assert_eq!(single.stats().lease_takeovers, 1);
}

/// With a soft timeout, a value the L1 holds stale waits for a fast load
/// in a batch as in a single call (up to the soft timeout), instead of
/// being served stale at once.
#[tokio::test(start_paused = true)]
async fn with_a_soft_timeout_a_stale_l1_entry_waits_for_a_fast_load_in_a_batch() {
    let backend = MemoryBackend::new();
    let cache = cache_in(NS, backend.clone(), |b| {
        b.ttl(SECOND)
            .grace(Duration::from_secs(60))
            .soft_timeout(Duration::from_millis(500))
            .jitter(0.0)
    });
    let wanted = keys(3);
    let first = Origin::default();
    // Loaded, then read once: the read's answer is what the L1 keeps.
    for _ in 0..3 {
        cache
            .get_or_load_many(&wanted, first.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
    }
    assert_eq!(cache.stats().l1_hits, 3, "the L1 holds the keys");
    tokio::time::advance(Duration::from_millis(1500)).await;

    let fast = Origin::default();
    let answers = cache
        .fetch_many(&wanted, fast.loader(Duration::from_millis(10), &[]))
        .await
        .unwrap();
    for k in &wanted {
        let answer = answers[k].as_ref().unwrap();
        assert_eq!(answer.outcome, Outcome::Loaded, "{k}: {answers:?}");
    }
    assert_eq!(fast.calls(), 1, "the stale keys were loaded together");

    // A single call on a stale key answers the same way.
    tokio::time::advance(Duration::from_millis(1500)).await;
    let single = cache
        .fetch(&"k0".to_owned(), |k| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, std::io::Error>(format!("v{k}"))
        })
        .await
        .unwrap();
    assert_eq!(single.outcome, Outcome::Loaded);
}
