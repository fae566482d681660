//! The conformance suite (`onefill::testing`) on the embedded backend, in
//! paused tokio time: every wait, lease expiry and poll is virtual, so
//! timings are exact.

use std::sync::Arc;

use async_trait::async_trait;
use onefill::backend::Backend;
use onefill::testing::Harness;
use onefill::MemoryBackend;

struct Memory(MemoryBackend);

#[async_trait]
impl Harness for Memory {
    async fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.0.clone())
    }
    fn paused(&self) -> bool {
        true
    }
}

async fn memory() -> Memory {
    Memory(MemoryBackend::new())
}

onefill::conformance_suite!(memory(), tokio::test(start_paused = true));
