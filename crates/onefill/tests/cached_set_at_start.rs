//! `#[onefill::cached]` on `DefaultBackend::set_at_start()`: a call before
//! `onefill::set_default_backend` fails, and makes nothing, so the backend
//! can still be set and the next call uses it. One test: the binary's
//! default is the process's.

use std::time::Duration;

use onefill_testkit::time_limit;

onefill::default_backend!(onefill::DefaultBackend::set_at_start());

#[onefill::cached]
async fn square(n: u64) -> Result<u64, onefill::Error> {
    Ok(n * n)
}

#[tokio::test]
async fn a_call_before_the_backend_is_set_leaves_it_settable() {
    let _limit = time_limit(Duration::from_secs(60));
    let early = square(3).await;
    assert!(
        matches!(early, Err(onefill::Error::Config(_))),
        "no backend yet: {early:?}"
    );
    onefill::set_default_backend(onefill::MemoryBackend::new())
        .expect("nothing was made on a default: it can still be set");
    assert_eq!(square(3).await.unwrap(), 9);
    assert!(
        onefill::set_default_backend(onefill::MemoryBackend::new()).is_err(),
        "set once"
    );
}
