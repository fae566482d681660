onefill::default_backend!(onefill::MemoryBackend::new());

#[onefill::cached(tll = "5m")]
async fn user(id: u64) -> anyhow::Result<String> {
    Ok(format!("user {id}"))
}

fn main() {}
