onefill::default_backend!(onefill::MemoryBackend::new());

#[onefill::cached]
async fn user(id: u64, #[cfg(any())] lang: String) -> anyhow::Result<String> {
    Ok(format!("user {id}"))
}

fn main() {}
