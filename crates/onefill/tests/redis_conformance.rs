//! The conformance suite (`onefill::testing`), unchanged, on real Redis: a
//! private standalone server per test, and a private 3-master cluster
//! shared by the tests that run at the same time. Real time here (tokio's
//! paused clock cannot drive a server's TTLs), so only counts and outcomes
//! are asserted. The standalone suite runs twice: through the async cache,
//! and through its blocking handle. Every backend connects as the README's
//! least-privilege ACL user.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use async_trait::async_trait;
use onefill::backend::Backend;
use onefill::redis::RedisBackend;
use onefill::testing::Harness;
use onefill_testkit::{time_limit, RedisCluster, RedisServer, TimeLimit};

mod acl;

/// Every backend connects as the README's least-privilege ACL user (the
/// suite's caches have the default L1 on Redis). The suite
/// makes its namespaces unique per run, so the user is granted them all;
/// `redis_acl.rs` shows the line keeping a cache to its own namespaces.
const ACL_NAMESPACES: &str = "*";

/// A scenario takes seconds (a cluster forms in a few); past this it hangs.
/// The harness holds the limit, so it bounds the whole test.
const LIMIT: Duration = Duration::from_secs(120);

/// A standalone server; every `backend()` is a new connection, as a new
/// process would open.
struct Standalone {
    _server: RedisServer,
    /// The README's least-privilege user's.
    url: String,
    _limit: TimeLimit,
}

#[async_trait]
impl Harness for Standalone {
    async fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(RedisBackend::connect(&self.url).await.expect("connect"))
    }
    fn paused(&self) -> bool {
        false
    }
}

async fn standalone() -> Standalone {
    let limit = time_limit(LIMIT);
    let server = RedisServer::start();
    Standalone {
        url: acl::url(&server, ACL_NAMESPACES, true),
        _server: server,
        _limit: limit,
    }
}

struct Cluster {
    _cluster: Arc<RedisCluster>,
    /// The README's least-privilege user's.
    urls: Vec<String>,
    _limit: TimeLimit,
}

#[async_trait]
impl Harness for Cluster {
    async fn backend(&self) -> Arc<dyn Backend> {
        let urls: Vec<&str> = self.urls.iter().map(String::as_str).collect();
        Arc::new(
            RedisBackend::connect_cluster(&urls)
                .await
                .expect("connect cluster"),
        )
    }
    fn paused(&self) -> bool {
        false
    }
}

/// One cluster for the tests running together (every scenario uses its own
/// namespace); it is shut down when the last of them ends.
async fn cluster() -> Cluster {
    let limit = time_limit(LIMIT);
    static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock();
    let c = shared.upgrade().unwrap_or_else(|| {
        let c = Arc::new(RedisCluster::start(3));
        *shared = Arc::downgrade(&c);
        c
    });
    Cluster {
        urls: acl::urls(&c, ACL_NAMESPACES, true),
        _cluster: c,
        _limit: limit,
    }
}

mod standalone {
    use super::*;
    onefill::conformance_suite!(
        standalone(),
        tokio::test(flavor = "multi_thread", worker_threads = 2)
    );
}

mod cluster {
    use super::*;
    onefill::conformance_suite!(
        cluster(),
        tokio::test(flavor = "multi_thread", worker_threads = 2)
    );
}

/// Every scenario again, each call made through the `BlockingCache` from a
/// blocking thread, each loader a plain closure on the blocking pool: the
/// synchronous callers' guarantees are the async ones.
mod blocking {
    use super::*;
    use onefill::testing::Blocking;

    async fn blocking_standalone() -> Blocking<Standalone> {
        Blocking(standalone().await)
    }

    onefill::conformance_suite!(
        blocking_standalone(),
        tokio::test(flavor = "multi_thread", worker_threads = 2)
    );
}
