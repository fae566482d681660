onefill::default_backend!(onefill::MemoryBackend::new());

// `"id"` for `"{id}"`: every call would share the first call's entry.
#[onefill::cached(key = "id")]
async fn user(id: u64) -> anyhow::Result<String> {
    Ok(format!("user {id}"))
}

fn main() {}
