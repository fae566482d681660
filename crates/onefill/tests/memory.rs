//! The conformance suite (`onefill::testing`) on the embedded backend, in
//! paused tokio time: every wait, lease expiry and poll is virtual, so
//! timings are exact.

use onefill::testing::CloneHarness;
use onefill::MemoryBackend;

async fn memory() -> CloneHarness<MemoryBackend> {
    CloneHarness {
        backend: MemoryBackend::new(),
        paused: true,
    }
}

onefill::conformance_suite!(memory(), tokio::test(start_paused = true));
