//! Bad input gets a clear error, never a panic: at build time and per call.

use std::time::Duration;

use onefill::{Cache, CallOptions, ConfigError, Error, InputError, LeaseTtl, WaitPolicy};

type C = Cache<String, String>;

fn ok_loader(_: String) -> std::future::Ready<Result<String, std::io::Error>> {
    std::future::ready(Ok("v".to_string()))
}

#[test]
fn namespaces_with_braces_or_empty_are_rejected() {
    for ns in ["", "a{b", "a}b", "{x}"] {
        let err = C::builder().namespace(ns).build().unwrap_err();
        assert!(
            matches!(err, ConfigError::Namespace { .. }),
            "{ns:?}: {err}"
        );
        assert!(err.to_string().contains("namespace"));
    }
}

#[test]
fn zero_or_absurd_options_are_rejected_at_build() {
    let bad: Vec<(&str, onefill::CacheBuilder<String, String>)> = vec![
        ("ttl", C::builder().ttl(Duration::ZERO)),
        (
            "ttl",
            C::builder().ttl(Duration::from_secs(10 * 365 * 24 * 3600)),
        ),
        (
            "grace",
            C::builder().grace(Duration::from_secs(10 * 365 * 24 * 3600)),
        ),
        ("jitter", C::builder().jitter(0.9)),
        ("jitter", C::builder().jitter(-0.1)),
        (
            "early_refresh_beta",
            C::builder().early_refresh_beta(f64::NAN),
        ),
        (
            "lease_ttl",
            C::builder().lease_ttl(LeaseTtl::Fixed(Duration::ZERO)),
        ),
        ("max_load_time", C::builder().max_load_time(Duration::ZERO)),
        (
            "wait.deadline",
            C::builder().wait(WaitPolicy::default().deadline(Duration::ZERO)),
        ),
        (
            "backend_timeout",
            C::builder().backend_timeout(Duration::from_secs(3600)),
        ),
        ("negative_ttl", C::builder().negative_ttl(Duration::ZERO)),
        ("max_value_bytes", C::builder().max_value_bytes(0)),
    ];
    for (option, builder) in bad {
        let err = builder.build().unwrap_err();
        match &err {
            ConfigError::Option { option: got, .. } => {
                assert_eq!(*got, option, "{err}")
            }
            other => panic!("{option}: unexpected {other:?}"),
        }
    }
    assert!(C::builder().build().is_ok(), "the defaults are valid");
}

#[tokio::test]
async fn empty_and_too_long_keys_are_rejected_per_call() {
    let cache = C::builder().max_key_bytes(8).build().unwrap();
    let err = cache
        .get_or_load(&String::new(), ok_loader)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(InputError::EmptyKey)));
    assert!(err.is_invalid_input());
    let err = cache
        .get_or_load(&"123456789".to_string(), ok_loader)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidInput(InputError::KeyTooLong { len: 9, max: 8 })
    ));
    assert!(cache
        .invalidate(&String::new())
        .await
        .unwrap_err()
        .is_invalid_input());
    assert!(cache
        .set(&String::new(), "v".into())
        .await
        .unwrap_err()
        .is_invalid_input());
    assert_eq!(cache.stats().loads_ok, 0, "nothing ran");
}

#[tokio::test]
async fn absurd_call_options_are_rejected_per_call() {
    let cache = C::builder().build().unwrap();
    let key = "k".to_string();
    for options in [
        CallOptions::new().ttl(Duration::ZERO),
        CallOptions::new().ttl(Duration::from_secs(u64::MAX / 4)),
        CallOptions::new().jitter(2.0),
        CallOptions::new().wait(WaitPolicy::default().polling(Duration::ZERO, Duration::ZERO)),
    ] {
        let err = cache
            .with_options(&options)
            .get_or_load(&key, ok_loader)
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{options:?}: {err}");
    }
    assert_eq!(cache.stats().loads_ok, 0);
}

#[tokio::test]
async fn a_value_over_the_size_limit_is_an_error_and_nothing_is_written() {
    let backend = onefill::MemoryBackend::new();
    let cache = C::builder()
        .backend(backend.clone())
        .max_value_bytes(64)
        .build()
        .unwrap();
    let key = "big".to_string();
    let err = cache
        .get_or_load(&key, |_| async { Ok::<_, std::io::Error>("x".repeat(100)) })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InputError::ValueTooLarge { max: 64, .. })
        ),
        "{err}"
    );
    assert!(backend.is_empty(), "no value and no lease left behind");
    let err = cache.set(&key, "y".repeat(100)).await.unwrap_err();
    assert!(err.is_invalid_input());
    assert!(backend.is_empty());
}

/// Hostile keys and options at their limits, on a store behind switches;
/// per-call options, the later setter winning.
mod on_a_store {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::support::{counting_loader, key, pod, switched, Switches, NS, REFUSE};
    use onefill::backend::{Acquired, Backend, FillKeys};
    use onefill::testing::failing_loader;
    use onefill::{Cache, CallOptions, CircuitBreaker, LeaseToken, LeaseTtl, WaitPolicy};
    use tokio::time::Instant;

    // ---------------------------------------------------------------------------
    // Keys (key.rs) and options (options.rs)
    // ---------------------------------------------------------------------------

    /// A guard: hostile keys round-trip and never collide with
    /// their escapes.
    #[tokio::test(start_paused = true)]
    async fn hostile_keys_round_trip_without_collisions() {
        let wire = switched();
        let c = pod(&wire, |b| b.max_key_bytes(64 * 1024));
        let long = "}{%".repeat(20_000);
        let keys = [
            "a{b",
            "a%7Bb",
            "a%257Bb",
            "}",
            "%7D",
            "{",
            "%",
            "%25",
            "\0",
            "\0}",
            "k\u{0}{x}",
            &long,
        ];
        for (i, k) in keys.iter().enumerate() {
            c.set(&k.to_string(), format!("v{i}")).await.unwrap();
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(
                c.get(&k.to_string()).await.unwrap(),
                Some(format!("v{i}")),
                "{k:?}"
            );
        }
        c.invalidate(&"a{b".to_string()).await.unwrap();
        assert_eq!(
            c.get(&"a%7Bb".to_string()).await.unwrap().as_deref(),
            Some("v1")
        );
        let too_long = "x".repeat(64 * 1024 + 1);
        assert!(c.get(&too_long).await.unwrap_err().is_invalid_input());
    }

    /// A guard: options at their limits build and answer; just
    /// past them they are refused with the setter's name.
    #[tokio::test(start_paused = true)]
    async fn options_at_their_limits() {
        let wire = switched();
        let c = pod(&wire, |b| {
            b.ttl(onefill::MAX_TTL)
                .grace(onefill::MAX_TTL)
                .jitter(0.5)
                .early_refresh_beta(100.0)
                .max_load_time(Duration::from_secs(24 * 3600))
                .lease_ttl(LeaseTtl::Fixed(Duration::from_millis(30)))
                .wait(WaitPolicy::default().deadline(Duration::from_secs(3600)))
                .negative_ttl(onefill::MAX_TTL)
                .fail_safe_throttle(onefill::MAX_TTL)
                .backend_timeout(Duration::from_millis(1))
                .circuit_breaker(CircuitBreaker::new(u32::MAX, Duration::from_secs(3600)))
        });
        let loads = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            c.get_or_load(&key(), counting_loader(&loads, Duration::from_millis(100)))
                .await
                .unwrap();
        }
        c.invalidate(&key()).await.unwrap();
        wire.set_mode(REFUSE);
        c.get_or_load(&key(), counting_loader(&loads, Duration::ZERO))
            .await
            .unwrap();
        let err = Cache::<String, String>::builder()
            .jitter(0.500001)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("jitter"), "{err}");
        let err = c
            .with_options(&CallOptions::new().ttl(onefill::MAX_TTL + Duration::from_millis(1)))
            .get_or_load(&key(), counting_loader(&loads, Duration::ZERO))
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }

    /// Per-call options, the later setter winning: `no_lease` after
    /// `lease_ttl` does not wait for a lease another process holds (it loads
    /// at once), and `no_negative_caching` overrides the cache-wide negative
    /// TTL (a failed load is not remembered: the next call loads again). The
    /// same calls without those options wait for the holder, and remember the
    /// failure, so each half can fail.
    #[tokio::test(start_paused = true)]
    async fn call_options_the_later_setter_wins() {
        let wire = switched();
        let deadline = Duration::from_millis(500);
        let c = pod(&wire, |b| {
            b.negative_ttl(Duration::from_secs(60))
                .wait(WaitPolicy::default().deadline(deadline))
        });
        let opts = CallOptions::new()
            .lease_ttl(LeaseTtl::default())
            .no_lease()
            .no_negative_caching();
        let held = |name: &str| {
            let store = wire.store().clone();
            let keys = FillKeys::new(NS, name);
            async move {
                let taken = store
                    .acquire(
                        &keys,
                        &LeaseToken::random(),
                        Duration::from_secs(60),
                        Duration::ZERO,
                    )
                    .await
                    .unwrap();
                assert!(matches!(taken, Acquired::Won { .. }), "{taken:?}");
            }
        };
        // How long a failing call takes on a key whose lease another process
        // holds, and how many loads two failing calls on a free key run.
        let run = |name: &'static str, options: CallOptions| {
            let c = c.clone();
            let held = held(name);
            async move {
                held.await;
                let calls = Arc::new(AtomicUsize::new(0));
                let started = Instant::now();
                let key = name.to_string();
                let _ = c
                    .with_options(&options)
                    .get_or_load(&key, failing_loader(&calls))
                    .await;
                let waited = started.elapsed();
                let free = format!("{name}-free");
                let calls = Arc::new(AtomicUsize::new(0));
                for _ in 0..2 {
                    let err = c
                        .with_options(&options)
                        .get_or_load(&free, failing_loader(&calls))
                        .await
                        .unwrap_err();
                    assert!(err.is_loader(), "{err:?}");
                }
                (waited, calls.load(Ordering::SeqCst))
            }
        };
        let (waited, loads) = run("with", opts).await;
        assert!(
            waited < deadline,
            "no_lease waited for the lease: {waited:?}"
        );
        assert_eq!(
            loads, 2,
            "no_negative_caching: the failure is not remembered"
        );
        let (waited, loads) = run("without", CallOptions::new()).await;
        assert!(
            waited >= deadline,
            "a leased call waits for the holder: {waited:?}"
        );
        assert_eq!(
            loads, 1,
            "the cache-wide negative TTL remembers the failure"
        );
    }
}
