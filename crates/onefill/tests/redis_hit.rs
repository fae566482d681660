//! The standalone Redis hit (decision 0011): the writing scripts stamp the
//! server's expiry into the envelope (version 2) and write the key with
//! `PXAT` that instant; a hit is a plain `GET` when that expiry and the
//! backend's estimate of the server's clock tell the value is fresh (or
//! stale in its grace window), and the pipelined `GET` + `PTTL` otherwise
//! (near the end of its freshness, version 1, bytes of another writer). Counted on the wire with `INFO commandstats`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onefill::backend::{Acquired, Backend, FillKeys};
use onefill::redis::RedisBackend;
use onefill::LeaseToken;
use onefill_testkit::{time_limit, RedisServer};

/// A test on private servers takes seconds; past this it hangs.
const LIMIT: Duration = Duration::from_secs(60);

fn keys(name: &str) -> FillKeys {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let ns = format!(
        "h{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    FillKeys::new(&ns, name)
}

/// A version-1 envelope, as onefill encodes it: magic, version, kind,
/// reserved, grace ms (u64 BE), delta ms (u32 BE), payload.
fn envelope(grace: Duration, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0xF1, 1, 0, 0];
    out.extend_from_slice(&(grace.as_millis() as u64).to_be_bytes());
    out.extend_from_slice(&7u32.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// `calls` of `cmdstat_<name>` (0 if never called).
fn calls(server: &RedisServer, name: &str) -> u64 {
    let info = server.command(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

fn reset_stats(server: &RedisServer) {
    server.command(&["CONFIG", "RESETSTAT"]);
}

/// What is stored under `key`, raw.
fn raw_get(server: &RedisServer, key: &str) -> Vec<u8> {
    server
        .query(&["GET", key])
        .as_bytes()
        .expect("a stored value")
        .to_vec()
}

/// The stored bytes are version 2 and record exactly the key's expiry
/// (`PEXPIRETIME`); the rest is what was written.
fn assert_stamped(server: &RedisServer, key: &str, written: &[u8]) {
    let stored = raw_get(server, key);
    assert_eq!(stored.len(), written.len() + 8, "{stored:?}");
    assert_eq!(stored[1], 2, "version 2");
    let mut at = [0u8; 8];
    at.copy_from_slice(&stored[16..24]);
    let pexpiretime = server
        .query(&["PEXPIRETIME", key])
        .as_int()
        .expect("an integer");
    assert_eq!(u64::from_be_bytes(at) as i64, pexpiretime);
    assert_eq!(stored[0], written[0]);
    assert_eq!(stored[2..16], written[2..16]);
    assert_eq!(stored[24..], written[16..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_hit_is_one_get_and_tells_no_more_than_the_server() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let keys = keys("fresh");
    let written = envelope(Duration::from_secs(5), b"payload");
    let ttl = Duration::from_secs(65);
    backend.set(&keys, &written, ttl).await.unwrap();
    assert_stamped(&server, keys.value(), &written);

    reset_stats(&server);
    let start = Instant::now();
    const HITS: u64 = 20;
    for _ in 0..HITS {
        let before = server.query(&["PTTL", keys.value()]).as_int().unwrap();
        let stored = backend.get(&keys).await.unwrap().expect("a value");
        let after = server.query(&["PTTL", keys.value()]).as_int().unwrap();
        // The version-1 bytes that were written, and never a TTL longer
        // than the server's (it reads `before` before the hit, `after`
        // after; PTTL rounds down, the figure is in microseconds).
        assert_eq!(stored.bytes, written);
        assert!(
            stored.ttl < Duration::from_millis(before as u64 + 1),
            "{stored:?} vs PTTL {before}"
        );
        assert!(
            stored.ttl + Duration::from_millis(25) >= Duration::from_millis(after as u64),
            "{stored:?} vs PTTL {after}"
        );
    }
    // The clock was sampled when the backend connected; a hit carries a
    // sample (`GET` + `TIME`) at most every ten seconds; every other hit
    // was a `GET` alone; no `PTTL` but the test's.
    let samples = calls(&server, "time");
    assert!(
        samples <= start.elapsed().as_secs() / 10 + 1,
        "{samples} samples"
    );
    assert_eq!(calls(&server, "get"), HITS);
    assert_eq!(calls(&server, "pttl"), 2 * HITS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_or_foreign_values_are_read_with_the_server_s_pttl_and_stale_ones_by_their_stamp() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    // The clock sample, on a key of its own.
    let warm = keys("warm");
    backend
        .set(
            &warm,
            &envelope(Duration::ZERO, b"w"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    backend.get(&warm).await.unwrap().expect("a value");

    // In its grace window (3 s left of a 5 s grace): stale by any clock
    // the server may read, so a `GET` alone, as a hit.
    let stale = keys("stale");
    let written = envelope(Duration::from_secs(5), b"s");
    backend
        .set(&stale, &written, Duration::from_secs(3))
        .await
        .unwrap();
    // Version 1, as a release before decision 0011 wrote it.
    let old = keys("old");
    let v1 = envelope(Duration::ZERO, b"o");
    server.query_bytes(&[b"SET", old.value().as_bytes(), &v1, b"PX", b"60000"]);
    // Not an envelope, and no expiry: another client's.
    let foreign = keys("foreign");
    server.command(&["SET", foreign.value(), "plain bytes of someone else"]);

    reset_stats(&server);
    let stored = backend.get(&stale).await.unwrap().expect("a value");
    assert_eq!(stored.bytes, written);
    assert!(stored.ttl <= Duration::from_secs(3), "{stored:?}");
    let stored = backend.get(&old).await.unwrap().expect("a value");
    assert_eq!(stored.bytes, v1);
    assert!(stored.ttl <= Duration::from_secs(60), "{stored:?}");
    let stored = backend.get(&foreign).await.unwrap().expect("a value");
    assert_eq!(stored.bytes, b"plain bytes of someone else");
    assert_eq!(stored.ttl, onefill::redis::NO_EXPIRY_TTL);
    // The stale one: a `GET` alone. Each of the others: a `GET` alone (or
    // with a `TIME`, if a clock sample came due), then the pair.
    assert_eq!(calls(&server, "pttl"), 2);
    assert_eq!(calls(&server, "get"), 5);

    // Gone: nothing, in one `GET`.
    let gone = keys("gone");
    assert!(backend.get(&gone).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fills_and_cached_failures_are_stamped_and_read_back_as_written() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lease = Duration::from_secs(10);
    let window = Duration::ZERO;

    let filled = keys("filled");
    let token = LeaseToken::random();
    assert!(matches!(
        backend
            .acquire(&filled, &token, lease, window)
            .await
            .unwrap(),
        Acquired::Won { stale: None }
    ));
    let written = envelope(Duration::ZERO, b"loaded");
    assert!(backend
        .fill(&filled, &token, &written, Duration::from_secs(30))
        .await
        .unwrap());
    assert_stamped(&server, filled.value(), &written);
    // The acquire script reads version 2 as fresh, and answers what was
    // written.
    match backend
        .acquire(&filled, &LeaseToken::random(), lease, window)
        .await
        .unwrap()
    {
        Acquired::Fresh(stored) => assert_eq!(stored.bytes, written),
        other => panic!("not fresh: {other:?}"),
    }

    let failed = keys("failed");
    let token = LeaseToken::random();
    backend
        .acquire(&failed, &token, lease, window)
        .await
        .unwrap();
    let mut failure = envelope(Duration::ZERO, b"boom");
    failure[2] = 1; // kind: a cached failure
    assert!(backend
        .release(&failed, &token, Some((&failure, Duration::from_secs(2))))
        .await
        .unwrap());
    assert_stamped(&server, failed.value(), &failure);
    assert_eq!(
        backend.get(&failed).await.unwrap().expect("stored").bytes,
        failure
    );

    // A re-store of bytes already stamped (version 2) is stamped anew,
    // not nested.
    let mut stamped = raw_get(&server, filled.value());
    stamped[24..].copy_from_slice(b"again!");
    backend
        .set(&filled, &stamped, Duration::from_secs(40))
        .await
        .unwrap();
    let mut as_v1 = stamped[..16].to_vec();
    as_v1[1] = 1;
    as_v1.extend_from_slice(b"again!");
    assert_stamped(&server, filled.value(), &as_v1);
}

/// A server without `TIME` (renamed away): the sample is refused, and the
/// hit is still answered, by the pair. (Writes need `TIME`: see decision
/// 0011.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_time_still_answers_hits() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start_with(&["--rename-command", "TIME", ""]);
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let old = keys("no-time");
    let v1 = envelope(Duration::ZERO, b"o");
    server.query_bytes(&[b"SET", old.value().as_bytes(), &v1, b"PX", b"60000"]);
    for _ in 0..3 {
        let stored = backend.get(&old).await.unwrap().expect("a value");
        assert_eq!(stored.bytes, v1);
        assert!(stored.ttl <= Duration::from_secs(60), "{stored:?}");
    }
    // Without a sample no `GET` went alone: every hit was answered by the
    // pair (the sample refused when the backend connected is not tried
    // again for ten seconds).
    assert_eq!(calls(&server, "pttl"), 3);
    assert_eq!(calls(&server, "get"), 3);
}

/// `expire` keeps the stamp true: the script moves the key's expiry to
/// now + grace (`PEXPIREAT`) and writes that instant into the version-2
/// envelope (`SETRANGE`), so the one-`GET` hit, which trusts the stamp,
/// reads the value as stale at once. A version-1 value gets the new expiry
/// alone (its bytes unchanged); a value stale already keeps its expiry, and
/// its stamp is made to tell it (another client may have cut it); a
/// value without grace, or bytes that are no envelope, are deleted; the
/// lease goes in every case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_rewrites_the_stamp_so_a_one_get_hit_reads_the_value_stale() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let grace = Duration::from_secs(5);
    let pttl = |key: &str| server.query(&["PTTL", key]).as_int().expect("an integer");

    let hot = keys("hot");
    let written = envelope(grace, b"payload");
    backend
        .set(&hot, &written, Duration::from_secs(65))
        .await
        .unwrap();
    let fresh = backend.get(&hot).await.unwrap().expect("a value");
    assert!(fresh.ttl > Duration::from_secs(60), "{fresh:?}");
    let token = LeaseToken::random();
    let leased = backend
        .acquire(&hot, &token, Duration::from_secs(10), Duration::MAX)
        .await
        .unwrap();
    assert!(matches!(leased, Acquired::Won { .. }), "{leased:?}");
    backend.expire(&hot).await.unwrap();
    assert_stamped(&server, hot.value(), &written);
    assert!(
        (0..=5_000).contains(&pttl(hot.value())),
        "{}",
        pttl(hot.value())
    );
    assert!(
        server.query(&["GET", hot.lock()]).is_nil(),
        "the lease is gone"
    );
    // The hit: stale (its GET alone could not tell, so the pair decides).
    let stale = backend.get(&hot).await.unwrap().expect("a value");
    assert_eq!(stale.bytes, written);
    assert!(stale.ttl <= grace, "{stale:?}");
    // Stale already: a second expire changes nothing.
    let before = server
        .query(&["PEXPIRETIME", hot.value()])
        .as_int()
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    backend.expire(&hot).await.unwrap();
    let after = server
        .query(&["PEXPIRETIME", hot.value()])
        .as_int()
        .unwrap();
    assert_eq!(before, after);

    // Cut under its stamp by another client's `PEXPIRE` (a one-`GET` hit
    // would read the stamp: fresh), so stale already: the expiry stays, and
    // the stamp is made to tell it.
    let cut = keys("cut");
    backend
        .set(&cut, &written, Duration::from_secs(65))
        .await
        .unwrap();
    server.command(&["PEXPIRE", cut.value(), "3000"]);
    backend.expire(&cut).await.unwrap();
    assert_stamped(&server, cut.value(), &written);
    assert!((0..=3_000).contains(&pttl(cut.value())));
    let stale = backend.get(&cut).await.unwrap().expect("a value");
    assert!(stale.ttl <= Duration::from_secs(3), "{stale:?}");

    // Version 1 (a release before decision 0011 wrote it): the TTL alone.
    let old = keys("old");
    let v1 = envelope(grace, b"o");
    server.query_bytes(&[b"SET", old.value().as_bytes(), &v1, b"PX", b"60000"]);
    backend.expire(&old).await.unwrap();
    assert_eq!(raw_get(&server, old.value()), v1);
    assert!((0..=5_000).contains(&pttl(old.value())));

    // No grace, or not an envelope: deleted.
    let graceless = keys("graceless");
    backend
        .set(
            &graceless,
            &envelope(Duration::ZERO, b"g"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let foreign = keys("foreign");
    server.command(&["SET", foreign.value(), "plain bytes of someone else"]);
    for gone in [&graceless, &foreign] {
        backend.expire(gone).await.unwrap();
        assert!(server.query(&["GET", gone.value()]).is_nil());
    }
    // Missing: still missing.
    let missing = keys("missing");
    backend.expire(&missing).await.unwrap();
    assert!(backend.get(&missing).await.unwrap().is_none());
}
