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
            .get_or_load_with(&key, &options, ok_loader)
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
