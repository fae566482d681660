onefill::default_backend!(onefill::MemoryBackend::new());

#[derive(Clone)]
struct Pool;

#[onefill::cached]
async fn user(id: u64, pool: &Pool) -> anyhow::Result<String> {
    let _ = pool;
    Ok(format!("user {id}"))
}

fn main() {}
