//! The conformance suite (`onefill::testing`), unchanged, on real Redis: a
//! private standalone server per test, and a private 3-master cluster
//! shared by the tests that run at the same time. Real time here (tokio's
//! paused clock cannot drive a server's TTLs), so only counts and outcomes
//! are asserted.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use async_trait::async_trait;
use onefill::backend::Backend;
use onefill::redis::RedisBackend;
use onefill::testing::Harness;
use onefill_testkit::{RedisCluster, RedisServer};

/// A standalone server; every `backend()` is a new connection, as a new
/// process would open.
struct Standalone(RedisServer);

#[async_trait]
impl Harness for Standalone {
    async fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(RedisBackend::connect(&self.0.url()).await.expect("connect"))
    }
    fn paused(&self) -> bool {
        false
    }
}

async fn standalone() -> Standalone {
    Standalone(RedisServer::start())
}

struct Cluster(Arc<RedisCluster>);

#[async_trait]
impl Harness for Cluster {
    async fn backend(&self) -> Arc<dyn Backend> {
        let urls = self.0.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
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
    static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock();
    if let Some(c) = shared.upgrade() {
        return Cluster(c);
    }
    let c = Arc::new(RedisCluster::start(3));
    *shared = Arc::downgrade(&c);
    Cluster(c)
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
