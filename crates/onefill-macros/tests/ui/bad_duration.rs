onefill::default_backend!(onefill::MemoryBackend::new());

#[onefill::cached(ttl = "5 min")]
async fn user(id: u64) -> anyhow::Result<String> {
    Ok(format!("user {id}"))
}

fn main() {}
