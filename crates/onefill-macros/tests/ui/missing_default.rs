// No `onefill::default_backend!(…)` at this crate's root.

#[onefill::cached(ttl = "5m")]
async fn user(id: u64) -> anyhow::Result<String> {
    Ok(format!("user {id}"))
}

fn main() {}
